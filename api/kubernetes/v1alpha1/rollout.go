package v1alpha1

// Rollout makes a change of the object go out as a staged rollout
// (docs/rollouts.md).
type Rollout struct {
	// Stages are the cohort sizes, strictly increasing, the last one "100%".
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=10
	// +kubebuilder:validation:items:Pattern=`^[0-9]{1,3}%$`
	Stages []string `json:"stages"`
	// Bake is how long each stage bakes, a Go duration such as "2m".
	// +optional
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$`
	Bake string `json:"bake,omitempty"`
	// MaxNackRatio halts the rollout when nacked/cohort exceeds it, "0.01".
	// +optional
	// +kubebuilder:validation:Pattern=`^(0(\.[0-9]+)?|1(\.0+)?)$`
	MaxNackRatio string `json:"maxNackRatio,omitempty"`
	// OnHalt is what a halted rollout does: roll back (the default) or stay.
	// +optional
	// +kubebuilder:validation:Enum=rollback;stay
	OnHalt string `json:"onHalt,omitempty"`
}
