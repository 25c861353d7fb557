package sessionv1

import "time"

// DefaultHeartbeatInterval is the heartbeat interval of a session whose
// gateway was configured with none (host.gateway.heartbeatInterval unset):
// the gateway tells it in Welcome, bcd uses it when a Welcome carries no
// usable interval, and the liveness reconciler and doctor judge nodes by
// it. One definition, so that the three agree.
const DefaultHeartbeatInterval = 10 * time.Second
