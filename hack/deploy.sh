#!/usr/bin/env bash
# deploy.sh: the body of `make deploy` and `make undeploy` (docs/cluster.md).
#
#   hack/deploy.sh deploy     apply config/default to the cluster of KUBECONFIG
#                             (server-side), with the image IMG and the
#                             components of BACKENDS; wait for the CRDs
#   hack/deploy.sh undeploy   delete every Sandbox and SessionClaim while the
#                             controller still runs to release them, then
#                             everything deploy applied
#
# Deleting Kubernetes objects never touches a node's disk: the agents' areas
# below /var/lib/sandbox-controller stay on every node.
#
# Knobs:
#   IMG               the controller's image, NAME:TAG or NAME@DIGEST
#                     (default sandbox-controller:dev; make passes
#                     IMAGE_NAME:VERSION, the name `make image` writes)
#   BACKENDS          backends besides bwrap, comma-separated: containerd,
#                     incus (the components under config/backends/)
#   CONTAINER_BUNDLES the nodes' directory of their containerd's bundles
#                     for the kubelet's containers (default
#                     /run/containerd/io.containerd.runtime.v2.task/k8s.io):
#                     bwrap Sandboxes with spec.bwrap.image see their Pod's
#                     container's root file system from there
#   SANDBOX_POD_IMAGE the image of the Pod each Sandbox gets, which only
#                     holds its place on a node (default: the aggregated
#                     API's, registry.k8s.io/pause:3.10, the pause image
#                     nodes hold); an image every node has
#   KUBECTL           the kubectl to run (default bin/k8s/<version>/kubectl,
#                     built by hack/envtest-assets.sh when missing)
#   UNDEPLOY_TIMEOUT  how long undeploy waits, first for the Sandboxes and
#                     SessionClaims to go, then for the rest (default 5m)
#
# When the Sandboxes and SessionClaims are not gone in time (their
# finalizers are the controller's to remove), undeploy lists those still
# there with their finalizers and exits 1 having deleted nothing else.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
overlay=$root/bin/deploy
group=sandbox.cireilclaw.dev
namespace=sandbox-controller-system
cmd=${1:-}

say() { printf '[%s] %s\n' "$cmd" "$*" >&2; }
fail() {
  say "$*"
  exit 1
}

find_kubectl() {
  kubectl=${KUBECTL:-}
  [ -n "$kubectl" ] && return
  kubectl=$("$root/hack/envtest-assets.sh" --print-dir)/kubectl
  [ -x "$kubectl" ] || WITH_KUBECTL=1 "$root/hack/envtest-assets.sh" >/dev/null
}

# find_server sets server to the API server KUBECONFIG points at, and
# stops when there is none.
find_server() {
  server=$("$kubectl" config view --minify -o jsonpath='{.clusters[0].cluster.server}') ||
    fail "no cluster to talk to: set KUBECONFIG (now ${KUBECONFIG:-unset})"
}

# write_overlay writes bin/deploy/kustomization.yaml: config/default with
# the image and the backends' components of this run.
write_overlay() {
  local img=${IMG:-sandbox-controller:dev} name tag='' digest='' b
  [[ $img =~ ^[A-Za-z0-9._/:@-]+$ ]] || fail "IMG=$img is not an image reference"
  case $img in
  *@*) name=${img%%@*} digest=${img#*@} ;;
  *)
    name=$img
    if [[ ${img##*/} == *:* ]]; then name=${img%:*} tag=${img##*:}; fi
    ;;
  esac
  [ -n "$tag$digest" ] || fail "IMG=$img has no tag: give NAME:TAG (make image tags its image with VERSION)"
  mkdir -p "$overlay"
  {
    echo "# Written by hack/deploy.sh for one make deploy; make writes it again each time."
    echo "resources:"
    echo "- ../../config/default"
    if [ -n "${BACKENDS:-}" ]; then
      echo "components:"
      for b in ${BACKENDS//,/ }; do
        [ -f "$root/config/backends/$b/kustomization.yaml" ] ||
          fail "BACKENDS=$BACKENDS: no component config/backends/$b (there are: containerd, incus)"
        echo "- ../../config/backends/$b"
      done
    fi
    [ -n "${SANDBOX_POD_IMAGE:-}${CONTAINER_BUNDLES:-}" ] && echo "patches:"
    if [ -n "${CONTAINER_BUNDLES:-}" ]; then
      [[ $CONTAINER_BUNDLES =~ ^/[A-Za-z0-9._/-]+$ ]] || fail "CONTAINER_BUNDLES=$CONTAINER_BUNDLES is not an absolute path"
      echo "- target: {kind: DaemonSet, name: sandbox-controller}"
      echo "  patch: |-"
      echo "    apiVersion: apps/v1"
      echo "    kind: DaemonSet"
      echo "    metadata: {name: sandbox-controller}"
      echo "    spec:"
      echo "      template:"
      echo "        spec:"
      echo "          volumes:"
      echo "          - name: container-bundles"
      echo "            hostPath: {path: \"$CONTAINER_BUNDLES\", type: DirectoryOrCreate}"
    fi
    if [ -n "${SANDBOX_POD_IMAGE:-}" ]; then
      [[ $SANDBOX_POD_IMAGE =~ ^[A-Za-z0-9._/:@-]+$ ]] || fail "SANDBOX_POD_IMAGE=$SANDBOX_POD_IMAGE is not an image reference"
      echo "- target: {kind: Deployment, name: sandbox-controller-api}"
      echo "  patch: |-"
      echo "    - op: add"
      echo "      path: /spec/template/spec/containers/0/env/-"
      echo "      value: {name: SANDBOX_POD_IMAGE, value: \"$SANDBOX_POD_IMAGE\"}"
    fi
    echo "images:"
    echo "- name: sandbox-controller"
    echo "  newName: \"$name\""
    [ -z "$tag" ] || echo "  newTag: \"$tag\""
    [ -z "$digest" ] || echo "  digest: \"$digest\""
  } >"$overlay/kustomization.yaml"
}

# The finalizer policy (config/admission) mutates a new Sandbox once the API
# server has loaded the Sandbox's schema for it, a few seconds after the
# CRD is established; until then the API server refuses a new Sandbox as
# unavailable. Wait for that with a dry run (which stores nothing), so that
# what is applied next is taken. Any other answer (a class refusing the
# probe) ends the wait too: the policy is in force.
wait_sandboxes_admitted() {
  local i out
  say "waiting until the API server takes new Sandboxes (the finalizer policy loads their schema)"
  for i in $(seq 1 90); do
    if out=$("$kubectl" create --dry-run=server -o name -f - 2>&1 <<EOF
apiVersion: sandbox.cireilclaw.dev/v1alpha1
kind: Sandbox
metadata:
  name: deploy-probe
  namespace: $namespace
spec:
  agent: deploy-probe
EOF
    ); then
      return 0
    fi
    case $out in
    *"(ServiceUnavailable)"*) sleep 1 ;;
    *) return 0 ;;
    esac
  done
  say "the API server still refuses new Sandboxes as unavailable after 90s: $out"
  exit 1
}

deploy() {
  write_overlay
  say "applying config/default (image ${IMG:-sandbox-controller:dev}, backends bwrap${BACKENDS:+,$BACKENDS}) to $server"
  "$kubectl" apply --server-side --field-manager=sandbox-controller-deploy -k "$overlay"
  "$kubectl" wait --for=condition=Established --timeout=60s crd -l app.kubernetes.io/part-of=sandbox-controller
  wait_sandboxes_admitted
  say "done. The image must be on every node (imported, or in a registry the nodes pull from)."
  say "The controller's pods: $kubectl -n $namespace get pods -o wide"
}

undeploy() {
  local timeout=${UNDEPLOY_TIMEOUT:-5m} kinds=() k list
  say "deleting from $server"
  for k in sandboxes sessionclaims; do
    if [ -n "$("$kubectl" get crd "$k.$group" -o name --ignore-not-found)" ]; then
      kinds+=("$k.$group")
    fi
  done
  if [ ${#kinds[@]} -gt 0 ]; then
    list=$(IFS=,; echo "${kinds[*]}")
    say "deleting every Sandbox and SessionClaim; the controller releases them (waiting up to $timeout)"
    if ! "$kubectl" delete "$list" --all --all-namespaces --wait --timeout="$timeout"; then
      "$kubectl" get "$list" --all-namespaces \
        -o custom-columns='KIND:.kind,NAMESPACE:.metadata.namespace,NAME:.metadata.name,NODE:.spec.nodeName,FINALIZERS:.metadata.finalizers' >&2 || true
      say "these are still there after $timeout. The controller on a Sandbox's node removes the finalizer"
      say "once it has deleted the Sandbox's instance and its claims; is it running there?"
      say "  $kubectl -n $namespace get pods -o wide"
      say "Nothing else was deleted: run make undeploy again (UNDEPLOY_TIMEOUT=10m to wait longer)."
      say "For a node that is gone for good, remove the finalizers by hand (the Sandbox's and its"
      say "claims'), leaving what the controller made on that node:"
      say "  $kubectl -n NAMESPACE patch sandbox NAME --type=merge -p '{\"metadata\":{\"finalizers\":null}}'"
      exit 1
    fi
  fi
  say "deleting the controller, its RBAC, the admission policy, the CRDs and the namespace (waiting up to $timeout)"
  if ! "$kubectl" delete -k "$root/config/default" --ignore-not-found --wait --timeout="$timeout"; then
    "$kubectl" get -k "$root/config/default" --ignore-not-found >&2 || true
    say "these are still there after $timeout (a CRD waits for the finalizers of Sandboxes or"
    say "SessionClaims made since the first step, a namespace for its pods to end); run make undeploy again."
    exit 1
  fi
  say "done. The agents' areas stay on the nodes (/var/lib/sandbox-controller): deleting Kubernetes objects never touches a node's disk."
}

case $cmd in
deploy | undeploy)
  find_kubectl
  find_server
  "$cmd"
  ;;
*)
  echo "usage: $0 deploy|undeploy" >&2
  exit 2
  ;;
esac
