package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupVersion is the API group and version of every kind here.
var GroupVersion = schema.GroupVersion{Group: "warren.dev", Version: "v1alpha1"}

// SchemeBuilder registers the kinds; AddToScheme adds them to a scheme.
var (
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)
	AddToScheme   = SchemeBuilder.AddToScheme
)

func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion,
		&SandboxTemplate{}, &SandboxTemplateList{},
		&Sandbox{}, &SandboxList{},
		&SandboxWarmPool{}, &SandboxWarmPoolList{},
		&SandboxClaim{}, &SandboxClaimList{},
		&SandboxSnapshot{}, &SandboxSnapshotList{},
		&SandboxFork{}, &SandboxForkList{},
		&SandboxRollback{}, &SandboxRollbackList{},
		&WarrenHost{}, &WarrenHostList{},
	)
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}

// Labels and annotations the fleet sets.
const (
	// LabelHost is set on a Sandbox to the WarrenHost it is placed on,
	// so that each host watches only its own sandboxes.
	LabelHost = "warren.dev/host"
	// LabelPool is set on a Sandbox a SandboxWarmPool made and has not
	// handed to a claim yet.
	LabelPool = "warren.dev/pool"
	// LabelTemplate is set on every Sandbox to its template's name.
	LabelTemplate = "warren.dev/template"
	// HostFinalizer keeps a Sandbox until its host has deleted the VM.
	HostFinalizer = "warren.dev/host-cleanup"
	// LeaseNamespace holds the hosts' coordination.k8s.io Leases, one per
	// WarrenHost, named after it (like kube-node-lease).
	LeaseNamespace = "warren-system"
)

// Condition types of a Sandbox.
const (
	// ConditionReady: the sandbox runs on its host and its agent answered.
	ConditionReady = "Ready"
	// ConditionSuspended: the sandbox is paused to a snapshot.
	ConditionSuspended = "Suspended"
	// ConditionLost: the sandbox's host stopped renewing its Lease.
	ConditionLost = "Lost"
	// ConditionRecovered: the sandbox was recreated on another host from
	// a snapshot after its host was lost; the message names the snapshot.
	ConditionRecovered = "Recovered"
)

// TemplateRef names a SandboxTemplate in the same namespace.
type TemplateRef struct {
	// Name of the SandboxTemplate.
	// +kubebuilder:validation:MinLength=1
	Name string `json:"name"`
}

// SandboxTemplateSpec is what a host builds a template from: a guest
// booted once, its start command run until ready, and snapshotted; every
// sandbox of it is a restore of that snapshot.
type SandboxTemplateSpec struct {
	// Image is a container image reference for the root file system;
	// Kernel, Initramfs and Disks are names of files in each host's guest
	// directory (never paths).
	// +optional
	Image string `json:"image,omitempty"`
	// +optional
	Kernel string `json:"kernel,omitempty"`
	// +optional
	Initramfs string `json:"initramfs,omitempty"`
	// +optional
	Disks []string `json:"disks,omitempty"`
	// MemoryMiB and CPUs size the guest.
	// +kubebuilder:validation:Minimum=16
	// +kubebuilder:default=256
	MemoryMiB int `json:"memoryMiB,omitempty"`
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:default=1
	CPUs int `json:"cpus,omitempty"`
	// Cmdline is the guest kernel's command line.
	// +optional
	Cmdline string `json:"cmdline,omitempty"`
	// Network gives the sandboxes a private network with filtered egress.
	// +optional
	Network bool `json:"network,omitempty"`
	// Balloon gives the sandboxes a memory balloon with free page reporting.
	// +optional
	Balloon bool `json:"balloon,omitempty"`
	// StartCommand is run and supervised in the guest before the
	// snapshot; ReadyCommand is run until it exits 0.
	// +optional
	StartCommand string `json:"startCommand,omitempty"`
	// +optional
	ReadyCommand string `json:"readyCommand,omitempty"`
	// +optional
	ReadyTimeoutSeconds int `json:"readyTimeoutSeconds,omitempty"`
}

// SandboxTemplateStatus says where the template was built and where its
// snapshots are.
type SandboxTemplateStatus struct {
	// Hosts lists the hosts that have it, with the daemon's template id
	// on each.
	// +optional
	Hosts []TemplateOnHost `json:"hosts,omitempty"`
	// Snapshots are the template's snapshots in the fleet's object
	// store, at most one per CPU group and generation: a host that needs
	// the template imports the one of its CPU group and the template's
	// generation instead of building it.
	// +optional
	Snapshots []TemplateSnapshot `json:"snapshots,omitempty"`
}

// TemplateOnHost is one host's copy of a template: the daemon's
// template id there, of the spec of Generation, built there or imported
// from the object store.
type TemplateOnHost struct {
	Host       string `json:"host"`
	TemplateID string `json:"templateID"`
	Generation int64  `json:"generation"`
	// ImportedFrom is the object store reference the host imported it
	// from; empty when the host built it.
	// +optional
	ImportedFrom string `json:"importedFrom,omitempty"`
}

// TemplateSnapshot is one build of a template uploaded to the object
// store: a template bundle of the spec of Generation, usable by the hosts
// of CPUGroup.
type TemplateSnapshot struct {
	CPUGroup   string `json:"cpuGroup"`
	Generation int64  `json:"generation"`
	// Ref is the bundle's reference (s3://BUCKET/TENANT/MANIFEST).
	Ref string `json:"ref"`
	// BuiltBy is the host that built and uploaded it.
	BuiltBy string `json:"builtBy"`
}

// SandboxTemplate is a reusable recipe for sandboxes.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="Image",type=string,JSONPath=`.spec.image`
// +kubebuilder:printcolumn:name="Memory",type=integer,JSONPath=`.spec.memoryMiB`
// +kubebuilder:printcolumn:name="CPUs",type=integer,JSONPath=`.spec.cpus`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type SandboxTemplate struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              SandboxTemplateSpec   `json:"spec"`
	Status            SandboxTemplateStatus `json:"status,omitempty"`
}

// SandboxTemplateList is a list of SandboxTemplates.
// +kubebuilder:object:root=true
type SandboxTemplateList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []SandboxTemplate `json:"items"`
}

// OperatingMode is the state a Sandbox should be in.
// +kubebuilder:validation:Enum=Running;Suspended
type OperatingMode string

// Operating modes.
const (
	OperatingModeRunning   OperatingMode = "Running"
	OperatingModeSuspended OperatingMode = "Suspended"
)

// ShutdownPolicy says what happens to a Sandbox at its shutdownTime.
// +kubebuilder:validation:Enum=Delete;Retain
type ShutdownPolicy string

// Shutdown policies: Delete deletes the object, Retain keeps it (its VM
// is stopped either way).
const (
	ShutdownPolicyDelete ShutdownPolicy = "Delete"
	ShutdownPolicyRetain ShutdownPolicy = "Retain"
)

// Resources are a sandbox's limits on its host (default the template's
// size); placement counts them as committed.
type Resources struct {
	// +optional
	MemoryMiB int `json:"memoryMiB,omitempty"`
	// +optional
	CPUs int `json:"cpus,omitempty"`
}

// SandboxSpec is the desired state of a Sandbox.
type SandboxSpec struct {
	// SandboxTemplateRef names the template it is restored from.
	SandboxTemplateRef TemplateRef `json:"sandboxTemplateRef"`
	// +optional
	Resources Resources `json:"resources,omitempty"`
	// EgressPolicy is Warren's egress policy (ebpf/policy JSON) for a
	// network template.
	// +optional
	// +kubebuilder:pruning:PreserveUnknownFields
	// +kubebuilder:validation:Schemaless
	EgressPolicy *runtime.RawExtension `json:"egressPolicy,omitempty"`
	// SecretNames are the tenant's secrets the credential proxy may use.
	// +optional
	SecretNames []string `json:"secretNames,omitempty"`
	// Env is KEY=VALUE added to every exec.
	// +optional
	Env []string `json:"env,omitempty"`
	// OperatingMode is Running (default) or Suspended.
	// +kubebuilder:default=Running
	// +optional
	OperatingMode OperatingMode `json:"operatingMode,omitempty"`
	// ShutdownTime is when the sandbox expires; ShutdownPolicy whether
	// the object is then deleted.
	// +optional
	ShutdownTime *metav1.Time `json:"shutdownTime,omitempty"`
	// +kubebuilder:default=Retain
	// +optional
	ShutdownPolicy ShutdownPolicy `json:"shutdownPolicy,omitempty"`
}

// SandboxStatus is the observed state of a Sandbox.
type SandboxStatus struct {
	// HostName is the WarrenHost it is placed on (nodeName in
	// agent-sandbox); set by the controller.
	// +optional
	HostName string `json:"hostName,omitempty"`
	// ExcludedHosts refused it for capacity; placement skips them.
	// +optional
	ExcludedHosts []string `json:"excludedHosts,omitempty"`
	// SandboxID is the daemon's id of it on HostName.
	// +optional
	SandboxID string `json:"sandboxID,omitempty"`
	// AgentEndpoint is the URL of the sandbox on its host's API.
	// +optional
	AgentEndpoint string `json:"agentEndpoint,omitempty"`
	// Snapshot is the object-store reference of its latest uploaded
	// snapshot (suspend, or a SandboxSnapshot), which a resume or a
	// recovery restores; SnapshotTime when it was taken.
	// +optional
	Snapshot string `json:"snapshot,omitempty"`
	// +optional
	SnapshotTime *metav1.Time `json:"snapshotTime,omitempty"`
	// SnapshotCPUGroup is the CPU group of the host that took Snapshot:
	// only hosts of that group can restore it.
	// +optional
	SnapshotCPUGroup string `json:"snapshotCPUGroup,omitempty"`
	// Phase is Pending, Placed, Running, Suspended, Lost, Expired or
	// Failed.
	// +optional
	Phase string `json:"phase,omitempty"`
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	// ObservedGeneration is the spec generation the host last acted on.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
}

// Sandbox is one microVM sandbox somewhere in the fleet.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="Template",type=string,JSONPath=`.spec.sandboxTemplateRef.name`
// +kubebuilder:printcolumn:name="Mode",type=string,JSONPath=`.spec.operatingMode`
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Host",type=string,JSONPath=`.status.hostName`
// +kubebuilder:printcolumn:name="ID",type=string,JSONPath=`.status.sandboxID`,priority=1
// +kubebuilder:printcolumn:name="Snapshot",type=string,JSONPath=`.status.snapshot`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type Sandbox struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              SandboxSpec   `json:"spec"`
	Status            SandboxStatus `json:"status,omitempty"`
}

// SandboxList is a list of Sandboxes.
// +kubebuilder:object:root=true
type SandboxList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Sandbox `json:"items"`
}

// SandboxWarmPoolSpec keeps Replicas ready sandboxes of a template.
type SandboxWarmPoolSpec struct {
	// +kubebuilder:validation:Minimum=0
	Replicas           int32       `json:"replicas"`
	SandboxTemplateRef TemplateRef `json:"sandboxTemplateRef"`
}

// SandboxWarmPoolStatus counts the pool's sandboxes.
type SandboxWarmPoolStatus struct {
	// Replicas are the pool's unclaimed sandboxes, ReadyReplicas those
	// of them that are Ready.
	Replicas      int32 `json:"replicas"`
	ReadyReplicas int32 `json:"readyReplicas"`
	// Selector selects the pool's sandboxes (for the scale subresource).
	// +optional
	Selector string `json:"selector,omitempty"`
}

// SandboxWarmPool keeps sandboxes ready for claims.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:subresource:scale:specpath=.spec.replicas,statuspath=.status.replicas,selectorpath=.status.selector
// +kubebuilder:printcolumn:name="Template",type=string,JSONPath=`.spec.sandboxTemplateRef.name`
// +kubebuilder:printcolumn:name="Desired",type=integer,JSONPath=`.spec.replicas`
// +kubebuilder:printcolumn:name="Current",type=integer,JSONPath=`.status.replicas`
// +kubebuilder:printcolumn:name="Ready",type=integer,JSONPath=`.status.readyReplicas`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type SandboxWarmPool struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              SandboxWarmPoolSpec   `json:"spec"`
	Status            SandboxWarmPoolStatus `json:"status,omitempty"`
}

// SandboxWarmPoolList is a list of SandboxWarmPools.
// +kubebuilder:object:root=true
type SandboxWarmPoolList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []SandboxWarmPool `json:"items"`
}

// SandboxClaimSpec asks for one sandbox of a template.
type SandboxClaimSpec struct {
	SandboxTemplateRef TemplateRef `json:"sandboxTemplateRef"`
	// WarmPool is "default" (take from any pool of the template), "none"
	// (always make a new sandbox) or a pool's name.
	// +kubebuilder:default=default
	// +optional
	WarmPool string `json:"warmpool,omitempty"`
}

// ClaimedSandbox names the sandbox a claim got.
type ClaimedSandbox struct {
	Name string `json:"name"`
}

// SandboxClaimStatus says which sandbox a claim got.
type SandboxClaimStatus struct {
	// +optional
	Sandbox ClaimedSandbox `json:"sandbox,omitempty"`
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// SandboxClaim takes one sandbox from a warm pool (or makes one).
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="Template",type=string,JSONPath=`.spec.sandboxTemplateRef.name`
// +kubebuilder:printcolumn:name="Sandbox",type=string,JSONPath=`.status.sandbox.name`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type SandboxClaim struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              SandboxClaimSpec   `json:"spec"`
	Status            SandboxClaimStatus `json:"status,omitempty"`
}

// SandboxClaimList is a list of SandboxClaims.
// +kubebuilder:object:root=true
type SandboxClaimList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []SandboxClaim `json:"items"`
}

// SandboxRef names a Sandbox in the same namespace.
type SandboxRef struct {
	// +kubebuilder:validation:MinLength=1
	Name string `json:"name"`
}

// RequestStatus is the outcome of a one-shot request (snapshot, fork,
// rollback): Phase is Pending, Done or Failed; Message says why.
type RequestStatus struct {
	// +optional
	Phase string `json:"phase,omitempty"`
	// +optional
	Message string `json:"message,omitempty"`
	// +optional
	HostName string `json:"hostName,omitempty"`
	// +optional
	CompletionTime *metav1.Time `json:"completionTime,omitempty"`
}

// Sandbox phases.
const (
	SandboxPending   = "Pending"
	SandboxPlaced    = "Placed"
	SandboxRunning   = "Running"
	SandboxSuspended = "Suspended"
	SandboxLost      = "Lost"
	SandboxExpired   = "Expired"
	SandboxFailed    = "Failed"
)

// Request phases.
const (
	PhasePending = "Pending"
	PhaseDone    = "Done"
	PhaseFailed  = "Failed"
)

// SandboxSnapshotSpec asks the sandbox's host to snapshot it and upload
// the snapshot to the object store.
type SandboxSnapshotSpec struct {
	SandboxRef SandboxRef `json:"sandboxRef"`
}

// SandboxSnapshotStatus adds the snapshot's reference to RequestStatus.
type SandboxSnapshotStatus struct {
	RequestStatus `json:",inline"`
	// Snapshot is the daemon's snapshot name; Location its object-store
	// reference.
	// +optional
	Snapshot string `json:"snapshot,omitempty"`
	// +optional
	Location string `json:"location,omitempty"`
}

// SandboxSnapshot is a snapshot of a sandbox.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="Sandbox",type=string,JSONPath=`.spec.sandboxRef.name`
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Location",type=string,JSONPath=`.status.location`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type SandboxSnapshot struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              SandboxSnapshotSpec   `json:"spec"`
	Status            SandboxSnapshotStatus `json:"status,omitempty"`
}

// SandboxSnapshotList is a list of SandboxSnapshots.
// +kubebuilder:object:root=true
type SandboxSnapshotList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []SandboxSnapshot `json:"items"`
}

// SandboxForkSpec asks for Count copy-on-write children of a sandbox, on
// its host; each becomes a Sandbox named NAME-N.
type SandboxForkSpec struct {
	SandboxRef SandboxRef `json:"sandboxRef"`
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=64
	// +kubebuilder:default=1
	Count int `json:"count,omitempty"`
}

// SandboxForkStatus lists the children made.
type SandboxForkStatus struct {
	RequestStatus `json:",inline"`
	// +optional
	Children []string `json:"children,omitempty"`
}

// SandboxFork forks a sandbox.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="Sandbox",type=string,JSONPath=`.spec.sandboxRef.name`
// +kubebuilder:printcolumn:name="Count",type=integer,JSONPath=`.spec.count`
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
type SandboxFork struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              SandboxForkSpec   `json:"spec"`
	Status            SandboxForkStatus `json:"status,omitempty"`
}

// SandboxForkList is a list of SandboxForks.
// +kubebuilder:object:root=true
type SandboxForkList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []SandboxFork `json:"items"`
}

// SandboxRollbackSpec asks to roll a sandbox back to one of its
// snapshots (a SandboxSnapshot's name), in place.
type SandboxRollbackSpec struct {
	SandboxRef SandboxRef `json:"sandboxRef"`
	// +kubebuilder:validation:MinLength=1
	SnapshotName string `json:"snapshotName"`
}

// SandboxRollback rolls a sandbox back.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="Sandbox",type=string,JSONPath=`.spec.sandboxRef.name`
// +kubebuilder:printcolumn:name="Snapshot",type=string,JSONPath=`.spec.snapshotName`
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
type SandboxRollback struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              SandboxRollbackSpec `json:"spec"`
	Status            RequestStatus       `json:"status,omitempty"`
}

// SandboxRollbackList is a list of SandboxRollbacks.
// +kubebuilder:object:root=true
type SandboxRollbackList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []SandboxRollback `json:"items"`
}

// WarrenHostSpec is what a host says of itself when it registers.
type WarrenHostSpec struct {
	// Endpoint is the URL of the host's daemon API that clients reach
	// sandboxes on.
	// +optional
	Endpoint string `json:"endpoint,omitempty"`
	// CPUGroup names the host's CPU fingerprint group: a snapshot taken
	// on one host restores only on hosts of the same group.
	CPUGroup string `json:"cpuGroup"`
	// Capacity is what the host offers sandboxes.
	Capacity HostResources `json:"capacity"`
	// Unschedulable keeps new sandboxes off it (a host being drained).
	// +optional
	Unschedulable bool `json:"unschedulable,omitempty"`
}

// HostResources are memory and CPUs.
type HostResources struct {
	MemoryMiB int `json:"memoryMiB"`
	CPUs      int `json:"cpus"`
}

// WarrenHostStatus is the host's latest report.
type WarrenHostStatus struct {
	// FreeMemoryMiB is the host's MemAvailable at its last heartbeat.
	// +optional
	FreeMemoryMiB int `json:"freeMemoryMiB,omitempty"`
	// Sandboxes is how many sandboxes it runs.
	// +optional
	Sandboxes int `json:"sandboxes,omitempty"`
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// WarrenHost is one warren-hostd host of the fleet (cluster-scoped, like
// a Node); its Lease in LeaseNamespace says it is alive.
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="CPU group",type=string,JSONPath=`.spec.cpuGroup`
// +kubebuilder:printcolumn:name="Memory",type=integer,JSONPath=`.spec.capacity.memoryMiB`
// +kubebuilder:printcolumn:name="CPUs",type=integer,JSONPath=`.spec.capacity.cpus`
// +kubebuilder:printcolumn:name="Free MiB",type=integer,JSONPath=`.status.freeMemoryMiB`
// +kubebuilder:printcolumn:name="Sandboxes",type=integer,JSONPath=`.status.sandboxes`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type WarrenHost struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              WarrenHostSpec   `json:"spec"`
	Status            WarrenHostStatus `json:"status,omitempty"`
}

// WarrenHostList is a list of WarrenHosts.
// +kubebuilder:object:root=true
type WarrenHostList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []WarrenHost `json:"items"`
}
