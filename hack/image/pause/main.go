// Command pause is the cluster's pod sandbox process and its smoke-test
// workload, one static binary so that no image has to come from a registry
// (hack/cluster.sh builds it into an image with ../static).
//
// As the sandbox (no arguments) it sleeps until SIGINT or SIGTERM and, being
// PID 1 of the pod, reaps every child that is handed to it.
//
// With -probe it is a workload: it prints what it finds of the pod's
// environment and, when the pod has a service account token and the
// Kubernetes service variables, asks the API server for /version through
// the service address, the way an in-cluster client would. It exits
// non-zero when that request fails.
package main

import (
	"crypto/tls"
	"crypto/x509"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"
)

const saDir = "/var/run/secrets/kubernetes.io/serviceaccount"

func main() {
	probe := flag.Bool("probe", false, "run the smoke test instead of sleeping")
	sleep := flag.Duration("sleep", 0, "with -probe: keep running this long after the probe")
	flag.Parse()
	if !*probe {
		pause()
		return
	}
	err := probeAPI()
	if *sleep > 0 {
		time.Sleep(*sleep)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "probe:", err)
		os.Exit(1)
	}
}

func pause() {
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range sigs {
		if s != syscall.SIGCHLD {
			return
		}
		for {
			var ws syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}

func probeAPI() error {
	host, _ := os.Hostname()
	fmt.Printf("probe: hostname %s, uid %d\n", host, os.Getuid())
	if addrs, err := net.InterfaceAddrs(); err == nil {
		var s []string
		for _, a := range addrs {
			s = append(s, a.String())
		}
		fmt.Printf("probe: addresses %s\n", strings.Join(s, " "))
	}
	svcHost, svcPort := os.Getenv("KUBERNETES_SERVICE_HOST"), os.Getenv("KUBERNETES_SERVICE_PORT")
	token, err := os.ReadFile(saDir + "/token")
	if svcHost == "" || err != nil {
		fmt.Println("probe: no service account token or KUBERNETES_SERVICE_HOST; API not tried")
		return nil
	}
	ca, err := os.ReadFile(saDir + "/ca.crt")
	if err != nil {
		return err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		return fmt.Errorf("no certificate in %s/ca.crt", saDir)
	}
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	url := "https://" + net.JoinHostPort(svcHost, svcPort) + "/version"
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(token)))
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	fmt.Printf("probe: GET %s: %s %s\n", url, resp.Status, strings.Join(strings.Fields(string(body)), " "))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return nil
}
