#!/bin/bash
# Generates fleet/api/v1alpha1/zz_generated.deepcopy.go and the CRD
# manifests in fleet/config/crd from the Go types (make crds).
set -euo pipefail
cd "$(dirname "$0")/.."
CG="go run sigs.k8s.io/controller-tools/cmd/controller-gen@v0.23.0"
$CG object paths=./fleet/api/...
rm -f fleet/config/crd/*.yaml
$CG crd paths=./fleet/api/... output:crd:artifacts:config=fleet/config/crd
$CG rbac:roleName=warren-controller paths=./fleet/controller/... output:rbac:artifacts:config=fleet/config/rbac/controller
$CG rbac:roleName=warren-host paths=./hostd/kube/... output:rbac:artifacts:config=fleet/config/rbac/host
