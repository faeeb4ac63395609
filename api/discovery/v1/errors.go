package discoveryv1

// ErrorDomain is the domain of the google.rpc.ErrorInfo a node attaches to
// a refusal whose cause a client must tell apart from the others
// (docs/sidecars.md, refusal reasons).
const ErrorDomain = "policyd.io"

// ErrorInfo reasons, with ErrorDomain.
const (
	// ReasonUnknownEmployee rides on Unauthenticated: the token verified,
	// but the node, current as of the stream's opening, holds no employee
	// of its subject. The employee may not have been created yet (a
	// provisioning script that starts the sidecar right after it), so a
	// client retries it for a bounded time before it counts as revoked; an
	// inactive employee (PermissionDenied) revokes at once.
	ReasonUnknownEmployee = "UNKNOWN_EMPLOYEE"
)
