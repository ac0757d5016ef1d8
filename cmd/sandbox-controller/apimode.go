package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	corev1 "k8s.io/api/core/v1"

	"k8s.io/client-go/kubernetes"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/cireilclaw/sandbox-controller/controllers"
	"github.com/cireilclaw/sandbox-controller/frontends/execapi"
	"github.com/cireilclaw/sandbox-controller/internal/servingcert"
)

// The modes of the binary: a node's controller (the DaemonSet), or the
// aggregated API (a Deployment of its own).
const (
	modeNode = "node"
	modeAPI  = "api"
)

// runAggregatedAPI is --mode=api: the server behind APIService
// v1alpha1.subresources.sandbox.cireilclaw.dev. It runs nothing itself: the
// API server authenticates and authorises the user and proxies the request
// here, and it forwards the request to the node that runs the claim's
// Sandbox with a client certificate of the forwarder CA, whose key only it
// holds. A node takes a user's name from a forwarded request only with
// that certificate, so a node that is taken cannot speak for a user to
// another node. It makes both CAs (the exec API's, which signs the nodes'
// serving certificates, and the forwarder's) and publishes their
// certificates; the nodes only read the first.
func runAggregatedAPI(ctx context.Context, f flags) error {
	log := ctrl.Log.WithName("setup")
	if f.apiService == "" || !f.api.Enabled() {
		return errors.New("--mode=api serves the aggregated API: it needs --api-service and --api-bind-address")
	}
	cfg, err := ctrl.GetConfig()
	if err != nil {
		return fmt.Errorf("finding the cluster (kubeconfig or in-cluster config): %w", err)
	}
	scheme, err := managerScheme()
	if err != nil {
		return err
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                 scheme,
		Metrics:                metricsserver.Options{BindAddress: f.metricsAddr},
		HealthProbeBindAddress: f.probeAddr,
		PprofBindAddress:       f.pprofAddr,
		Cache:                  cacheOptions(cfg),
	})
	if err != nil {
		return fmt.Errorf("creating the manager: %w", err)
	}
	// Straight to the API server: the manager's cache would watch every
	// Secret of the cluster.
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return err
	}
	loadCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	execCA, err := servingcert.ExecAPICA.Ensure(loadCtx, c, f.systemNamespace, time.Now())
	if err != nil {
		return err
	}
	if err := servingcert.ExecAPICA.Publish(loadCtx, c, f.systemNamespace, execCA.PEM); err != nil {
		return err
	}
	// The API server verifies the Service's name.
	svc := f.apiService + "." + f.systemNamespace + ".svc"
	certs := &servingcert.Source{Client: c, Namespace: f.systemNamespace, Authority: servingcert.ForwarderCA,
		ClientName: servingcert.ForwarderName, Hosts: []string{svc, svc + ".cluster.local"},
		Validity: f.certValidity, Log: ctrl.Log.WithName("servingcert")}
	if err := certs.Load(loadCtx); err != nil {
		return fmt.Errorf("the aggregated API's serving certificate: %w", err)
	}
	if err := mgr.Add(certs); err != nil {
		return err
	}
	if err := mgr.Add(&servingcert.APIServicePublisher{Client: c, Name: execapi.APIServiceName, CA: certs.CAPEM,
		Log: ctrl.Log.WithName("servingcert")}); err != nil {
		return err
	}
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("aggregated API: %w", err)
	}
	// A user's own client certificate is taken as the API server takes it;
	// such a request is then told where the claim's node is.
	f.api.ClusterClientCA = f.api.ClientCAFile == ""
	auth, err := execapi.DelegatingAuth(kube, f.api)
	if err != nil {
		return fmt.Errorf("aggregated API: %w", err)
	}
	if err := execapi.FrontProxyAuth(kube, ctrl.Log.WithName("execapi"), &auth); err != nil {
		return fmt.Errorf("aggregated API: %w", err)
	}
	srv, err := execapi.New(f.api, execapi.Options{
		Reader:         mgr.GetClient(),
		Auth:           auth,
		Log:            ctrl.Log.WithName("execapi"),
		GetCertificate: certs.GetCertificate,
		Forwarding:     &execapi.Forwarding{CAPEM: execCA.PEM, GetClientCertificate: certs.GetClientCertificate},
		ForwardOnly:    true,
	})
	if err != nil {
		return fmt.Errorf("aggregated API: %w", err)
	}
	if err := mgr.Add(srv); err != nil {
		return err
	}
	// Every Sandbox gets its Pod here, which kube-scheduler binds to a
	// node (controllers/placement.go).
	holder := f.holderImage
	if holder == "" {
		var herr error
		if holder, herr = ownImage(ctx, mgr.GetAPIReader()); herr != nil {
			log.Info("bwrap Sandboxes with an image are not placed: no holder image", "reason", herr.Error())
		}
	}
	if err := controllers.SetupPlacement(ctx, mgr, controllers.PlacementOptions{
		SystemNamespace: f.systemNamespace, PodImage: f.podImage, NodeLostAfter: f.nodeLostAfter,
		HolderImage: holder,
	}); err != nil {
		return fmt.Errorf("setting up placement: %w", err)
	}
	// The nodes' serving certificates: only this Deployment holds the exec
	// API CA's key.
	signer := &servingcert.Signer{Client: mgr.GetClient(), CA: execCA, Validity: f.certValidity,
		User: "system:serviceaccount:" + f.systemNamespace + ":" + f.nodeServiceAccount}
	if err := signer.SetupWithManager(mgr); err != nil {
		return fmt.Errorf("setting up the nodes' certificate signer: %w", err)
	}
	if err := addProbes(mgr); err != nil {
		return err
	}
	log.Info("starting the aggregated API", "service", f.systemNamespace+"/"+f.apiService)
	if err := mgr.Start(ctx); err != nil {
		return fmt.Errorf("running the aggregated API: %w", err)
	}
	return nil
}

// ownImage is the image this process's container runs (POD_NAMESPACE and
// POD_NAME, from the downward API, name its Pod): the controller's image,
// which holds the holder the Pods of bwrap Sandboxes with an image copy.
func ownImage(ctx context.Context, r client.Reader) (string, error) {
	ns, name := os.Getenv("POD_NAMESPACE"), os.Getenv("POD_NAME")
	if ns == "" || name == "" {
		return "", errors.New("give --holder-image, or run in a Pod with POD_NAMESPACE and POD_NAME set (config/aggregated does)")
	}
	var pod corev1.Pod
	if err := r.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &pod); err != nil {
		return "", fmt.Errorf("reading this process's Pod %s/%s for its image: %w", ns, name, err)
	}
	if len(pod.Spec.Containers) == 0 {
		return "", fmt.Errorf("this process's Pod %s/%s has no container", ns, name)
	}
	return pod.Spec.Containers[0].Image, nil
}
