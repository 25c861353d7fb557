package tests

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"golang.org/x/time/rate"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/better-compute/better-compute/bcd/session"
	"github.com/better-compute/better-compute/controlplane/pkg/admission"
	"github.com/better-compute/better-compute/controlplane/pkg/sim"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/proto/jointoken"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// dialerFrom dials from the loopback address ip (any 127.0.0.0/8 address
// is a local source address on Linux).
func dialerFrom(ip string) *net.Dialer {
	return &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 10 * time.Second}
}

// TestGatewayJunkStarvesNoNode (issue 28): against a real serve on
// PostgreSQL, 1,000 TCP connections from 127.0.0.2 that open and say
// nothing, and a flood of Joins with bad tokens (malformed, and well formed
// but unknown) from 127.0.0.3, while 50 FakeDaemons join from 127.0.0.1
// with one token: all 50 join within 30 s (and then hold sessions within
// 30 s), and the audit log's refused
// joins come in at most one row a minute per source address and reason
// (so do serve's "Join refused" lines). (Before, the idle connections held
// all 64 setup slots for 10 s each and the daemons' connections waited in
// the backlog behind them past their join deadline; every bad-token Join
// wrote its own audit row and log line.)
func TestGatewayJunkStarvesNoNode(t *testing.T) {
	t.Parallel()
	const idleConns, daemons = 1000, 50
	// The idle connections are this process's descriptors.
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	if lim.Cur < 4*idleConns {
		raised := unix.Rlimit{Cur: min(lim.Max, 4*idleConns), Max: lim.Max}
		if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &raised); err != nil || raised.Cur < 2*idleConns {
			t.Fatalf("RLIMIT_NOFILE %d (hard %d) is too low for %d connections: %v", lim.Cur, lim.Max, idleConns, err)
		}
	}
	ctx := context.Background()
	d := newDeployment(t, backendPostgres)
	tokenFile, _ := d.joinToken(daemons, time.Hour)
	token := strings.TrimSpace(readFile(t, tokenFile))
	start := time.Now()

	// 1,000 idle connections from 127.0.0.2, held to the end; the gateway
	// may close those it does not queue.
	var closedByGateway atomic.Int64
	var idle sync.WaitGroup
	var conns []net.Conn
	t.Cleanup(func() {
		for _, c := range conns {
			c.Close()
		}
		idle.Wait()
	})
	for i := range idleConns {
		c, err := dialerFrom("127.0.0.2").Dial("tcp", d.gwAddr)
		if err != nil {
			t.Fatalf("idle connection %d from 127.0.0.2: %v", i, err)
		}
		conns = append(conns, c)
		idle.Go(func() {
			if _, err := io.Copy(io.Discard, c); err == nil {
				closedByGateway.Add(1)
			}
		})
	}
	t.Logf("%d idle connections from 127.0.0.2 open", idleConns)

	// The Join flood from 127.0.0.3, on one HTTP/2 connection, at most
	// 500 a second (a well-formed but unknown token every other time).
	floodCtx, stopFlood := context.WithCancel(ctx)
	cc, err := grpc.NewClient("passthrough:///"+d.gwAddr,
		grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS13})), //nolint:gosec // the attacker trusts anything
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return dialerFrom("127.0.0.3").DialContext(ctx, "tcp", addr)
		}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	parsed, err := jointoken.Parse(token)
	if err != nil {
		t.Fatal(err)
	}
	unknown, err := jointoken.New(parsed.Pin(), nil)
	if err != nil {
		t.Fatal(err)
	}
	_, csr := newKeyCSR(t)
	var sent, exhausted, refusedToken atomic.Int64
	var flood sync.WaitGroup
	pace := rate.NewLimiter(500, 10)
	for w := range 4 {
		flood.Go(func() {
			join := sessionv1.NewJoinServiceClient(cc)
			for i := 0; pace.Wait(floodCtx) == nil; i++ {
				tok := "not-a-join-token"
				if (i+w)%2 == 0 {
					tok = unknown.String()
				}
				_, err := join.Join(floodCtx, &sessionv1.JoinRequest{Token: tok, Csr: csr,
					Facts: &sessionv1.NodeFacts{Hostname: "flood", Os: runtime.GOOS, Arch: runtime.GOARCH}})
				sent.Add(1)
				switch status.Code(err) {
				case codes.ResourceExhausted:
					exhausted.Add(1)
				case codes.Unauthenticated:
					refusedToken.Add(1)
				}
			}
		})
	}
	t.Cleanup(func() { stopFlood(); flood.Wait() })
	eventually(t, 30*time.Second, func() bool { return exhausted.Load() > 0 },
		func() string {
			return fmt.Sprintf("%d Joins sent from 127.0.0.3, none refused for the rate", sent.Load())
		})

	// 50 FakeDaemons join from 127.0.0.1 with one token, all at once.
	fleet, err := sim.NewFleet(sim.FleetConfig{GatewayURL: d.gatewayURL, Token: token, N: daemons, JoinConcurrency: daemons,
		NamePrefix: "flood", Session: session.Config{StartJitter: -1}})
	if err != nil {
		t.Fatal(err)
	}
	joinStart := time.Now()
	joinCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	err = fleet.Join(joinCtx)
	cancel()
	took := time.Since(joinStart)
	if joined := fleet.Stats().Joined; err != nil || joined != daemons {
		t.Fatalf("%d of %d FakeDaemons joined in %s (%v) beside 1,000 idle connections and a Join flood (%d sent, %d refused for the rate, %d for the token); want all within 30 s",
			joined, daemons, took.Round(time.Millisecond), err, sent.Load(), exhausted.Load(), refusedToken.Load())
	}
	t.Logf("%d FakeDaemons joined in %s; meanwhile %d Joins from 127.0.0.3 (%d refused for the rate, %d for the token), %d idle connections closed by the gateway",
		daemons, took.Round(time.Millisecond), sent.Load(), exhausted.Load(), refusedToken.Load(), closedByGateway.Load())
	// And they open their sessions, the flood still on.
	runCtx, stopRun := context.WithCancel(ctx)
	runDone := make(chan error, 1)
	go func() { runDone <- fleet.Run(runCtx) }()
	t.Cleanup(func() { stopRun(); <-runDone })
	connectStart := time.Now()
	waitCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	err = fleet.WaitFor(waitCtx, func(s sim.FleetStats) bool { return s.Connected >= daemons })
	cancel()
	if err != nil {
		t.Fatalf("%d of %d FakeDaemons hold a session 30 s after they started (%v), beside the idle connections and the flood",
			fleet.Stats().Connected, daemons, err)
	}
	t.Logf("%d sessions open in %s", daemons, time.Since(connectStart).Round(time.Millisecond))
	stopFlood()
	flood.Wait()

	// The audit log: at most one refused-join row a minute per source
	// address and reason, however many were refused.
	elapsed := time.Since(start)
	rows, err := d.st.AuditQuery(ctx, &store.AuditQueryParams{ActionPrefix: admission.ActionJoin, Outcome: admission.OutcomeRefused,
		Limit: store.MaxListLimit})
	if err != nil {
		t.Fatal(err)
	}
	perKey := map[string]int{}
	counted := 0
	for _, e := range rows {
		var details struct {
			Refusal  string `json:"refusal"`
			Refusals int    `json:"refusals"`
		}
		if err := json.Unmarshal(e.Details, &details); err != nil {
			t.Fatalf("audit row %d details %s: %v", e.ID, e.Details, err)
		}
		perKey[e.SourceIP+" "+details.Refusal]++
		counted += details.Refusals
	}
	allowed := int(elapsed/time.Minute) + 1
	for key, n := range perKey {
		if n > allowed {
			t.Fatalf("%d refused-join audit rows for %q in %s, want at most %d (one a minute per source and reason); all: %v",
				n, key, elapsed.Round(time.Second), allowed, perKey)
		}
	}
	if len(perKey) == 0 || perKey["127.0.0.3 "+admission.RefusalRateLimited] == 0 {
		t.Fatalf("refused-join audit rows %v: want the rate-limited Joins of 127.0.0.3 summarised", perKey)
	}
	if logged := countLines(d.serve, regexp.MustCompile(`msg="Join refused"`)); logged > len(rows) {
		t.Fatalf("serve logged %d \"Join refused\" lines for %d audit rows", logged, len(rows))
	}
	t.Logf("refused-join audit rows in %s: %v (%d refusals counted in them so far, of %d Joins sent)",
		elapsed.Round(time.Second), perKey, counted, sent.Load())
}
