// Package v1alpha1 holds the warren.dev/v1alpha1 custom resources: the
// kinds of kubernetes-sigs/agent-sandbox (Sandbox, SandboxTemplate,
// SandboxWarmPool, SandboxClaim), with their field names wherever they
// apply, and Warren's own (SandboxSnapshot, SandboxFork,
// SandboxRollback, WarrenHost).
//
// The CustomResourceDefinitions in fleet/config/crd are generated from
// these types (make crds, controller-gen); so is zz_generated.deepcopy.go.
//
// +kubebuilder:object:generate=true
// +groupName=warren.dev
package v1alpha1
