package session

import "errors"

// Errors returned by this package; match them with errors.Is.
var (
	// ErrRevoked reports that the control plane revoked the node's identity:
	// the gateway sent Revoked, refused Connect with PERMISSION_DENIED or
	// refused Renew with UNAUTHENTICATED. The node must be joined again;
	// retrying does not help. The error's text carries the gateway's reason.
	ErrRevoked = errors.New("node identity revoked")
	// ErrCertificateExpired reports that the node's certificate expired
	// before it could be renewed (for example after the machine was off for
	// longer than the certificate's life). The node must be joined again
	// with a fresh join token.
	ErrCertificateExpired = errors.New("node certificate expired")
	// ErrCertificateNotYetValid reports that a gateway refused the node's
	// certificate because, by the gateway's clock, its validity has not
	// begun: the control plane's clock is behind the one that issued it.
	// Not final: the node retries, and connects once the clock is right.
	ErrCertificateNotYetValid = errors.New("node certificate not yet valid")
	// ErrNotConnected reports a send while the Client holds no session, or
	// through a send function of a session that has ended.
	ErrNotConnected = errors.New("no session with a gateway")
	// ErrProtocol reports a gateway that broke the session protocol, for
	// example by answering Hello with something other than Welcome.
	ErrProtocol = errors.New("session protocol violation")
	// ErrUntrustedGateway reports a gateway whose TLS certificate chain is
	// not trusted: it does not match the pin or does not verify against the
	// configured CA pool.
	ErrUntrustedGateway = errors.New("gateway certificate not trusted")
	// ErrJoinRefused reports a Join the gateway refused: an unknown,
	// expired, revoked or used-up token (UNAUTHENTICATED) or a request it
	// would not accept (INVALID_ARGUMENT, PERMISSION_DENIED). The error's
	// text carries the gateway's message.
	ErrJoinRefused = errors.New("join refused")
	// ErrProofRefused reports a Join whose key proof (JoinParams.ProveChain)
	// the gateway did not accept: the chain is not of this deployment, the
	// node was deleted or revoked, or the key is not its latest. It is
	// wrapped together with ErrJoinRefused.
	ErrProofRefused = errors.New("key proof refused")
	// ErrConfig reports an invalid Config or JoinParams.
	ErrConfig = errors.New("invalid session config")
)
