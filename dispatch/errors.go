package dispatch

import "errors"

var (
	// ErrNoCapacity is returned by Model.Decide when no route has an eligible
	// agent: every agent of the model is stale, draining, without slots, or
	// there are none. It is transient; ingress maps it to 503 Service
	// Unavailable. Decide returns it wrapped with the model name, in a value
	// built once per snapshot, so the refusal itself does not allocate.
	ErrNoCapacity = errors.New("dispatch: no eligible agent")

	// ErrUnsupported is returned by Model.Decide for a request that PD cannot
	// serve (Need.NoPD) when the model has no eligible regular agent while its
	// PD pipeline is up. Retrying will not help until regular agents return;
	// ingress maps it to a client-visible error naming Need.Reason. It is
	// wrapped with the model name and the reason.
	ErrUnsupported = errors.New("dispatch: request not supported by the available route")

	// ErrInvalid is returned by the Parse functions and Config.Validate for a
	// value outside the documented set.
	ErrInvalid = errors.New("dispatch: invalid value")
)
