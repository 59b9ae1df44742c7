#!/usr/bin/env bash
# Regenerates go.mod/go.sum of the e2e module for one Kubernetes release (run by a developer; commit the output).
# k8s.io/kubernetes requires its staging modules at v0.0.0 and maps them to ./staging with replace directives
# that a consumer's build ignores, so each staging module is mapped here to its published v0.<minor>.<patch> tag.
set -euo pipefail
K8S_VERSION=${K8S_VERSION:-1.37.2}
STAGING_VERSION="v0.${K8S_VERSION#1.}"
cd "$(dirname "$0")"
export GOTOOLCHAIN=local GOFLAGS=-modcacherw

tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && go mod init tmp >/dev/null 2>&1 && go mod download -json "k8s.io/kubernetes@v${K8S_VERSION}") > "$tmp/dl.json"
KGOMOD=$(sed -n 's/.*"GoMod": "\(.*\)".*/\1/p' "$tmp/dl.json")
test -s "$KGOMOD"

rm -f go.mod go.sum
go mod init gpuslice.local/e2e/k8s
GO_LINE=$(awk '$1=="go"{print $2; exit}' "$KGOMOD")
go mod edit -go="$GO_LINE" -godebug=default=go1.26

for m in $(sed -n 's|^[[:space:]]*k8s.io/\([a-z0-9-]*\) => \./staging/src/k8s\.io/.*|\1|p' "$KGOMOD"); do
  go mod edit -replace="k8s.io/${m}=k8s.io/${m}@${STAGING_VERSION}"
done

# etcd server at the version k/k itself pins, so its client libraries and the server agree.
ETCD_SERVER=$(awk '$1=="go.etcd.io/etcd/server/v3"{print $2}' "$KGOMOD")
go get "k8s.io/kubernetes@v${K8S_VERSION}" "go.etcd.io/etcd/server/v3@${ETCD_SERVER}"
go mod tidy
echo "k8s v${K8S_VERSION}, staging ${STAGING_VERSION}, etcd server ${ETCD_SERVER}, go ${GO_LINE}"
