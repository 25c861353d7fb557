package main

import (
	"context"
	"crypto"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/better-compute/better-compute/bcd/session"
	"github.com/better-compute/better-compute/controlplane/pkg/pki"
	"github.com/better-compute/better-compute/controlplane/pkg/sim"
	"github.com/better-compute/better-compute/proto/jointoken"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// renewOptions are the renewal benchmark's flags (tests/bench/sessions
// -renewals).
type renewOptions struct {
	// afterFile, when set, receives one line per daemon after the joins:
	// "issued_unix_ns renew_after_unix_ns not_after_unix_ns", the time of
	// issue (NotBefore + pki.NodeBackdate) and the renew_after the gateway
	// answered with.
	afterFile string
	// d is how long to renew for; 0 runs the sessions instead.
	d time.Duration
	// concurrency is the renewals in flight at once.
	concurrency int
}

// writeRenewAfter writes the join certificates' times of issue, renew_after
// and NotAfter to file (renewOptions.afterFile).
func writeRenewAfter(file string, daemons []*sim.FakeDaemon) error {
	fh, err := os.Create(file)
	if err != nil {
		return err
	}
	for _, d := range daemons {
		id := d.Identity()
		leaf := id.Chain[0]
		fmt.Fprintf(fh, "%d %d %d\n", leaf.NotBefore.Add(pki.NodeBackdate).UnixNano(), id.RenewAfter.UnixNano(), leaf.NotAfter.UnixNano())
	}
	return fh.Close()
}

// renewer renews one daemon's certificate as bcd does (bcd/session
// renewVia): a new mutual-TLS connection presenting the latest certificate,
// the gateway checked against the join token's pin, one JoinService.Renew
// with a fresh CSR for the same key, the answer's certificate checked
// against the node CA roots and used from then on.
type renewer struct {
	key        crypto.Signer
	pin        string
	host, addr string
	mu         sync.Mutex // one renewal at a time
	cert       atomic.Pointer[tls.Certificate]
}

func newRenewer(d *sim.FakeDaemon) (*renewer, error) {
	id := d.Identity()
	u, err := url.Parse(id.Gateways[0])
	if err != nil {
		return nil, err
	}
	port := u.Port()
	if port == "" {
		port = "443"
	}
	r := &renewer{key: d.Key(), pin: id.Trust.Pin, host: u.Hostname(), addr: net.JoinHostPort(u.Hostname(), port)}
	r.cert.Store(&tls.Certificate{Certificate: [][]byte{id.Chain[0].Raw}, PrivateKey: r.key, Leaf: id.Chain[0]})
	return r, nil
}

func (r *renewer) renew(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	csr, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, r.key)
	if err != nil {
		return err
	}
	cfg := &tls.Config{
		MinVersion:           tls.VersionTLS13,
		ServerName:           r.host,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return r.cert.Load(), nil },
		InsecureSkipVerify:   true, //nolint:gosec // verified against the pin in VerifyConnection, as bcd does
		VerifyConnection: func(cs tls.ConnectionState) error {
			return jointoken.VerifyChain(r.pin, cs.PeerCertificates, r.host, time.Now())
		},
	}
	cc, err := grpc.NewClient("passthrough:///"+r.addr,
		grpc.WithTransportCredentials(credentials.NewTLS(cfg)),
		grpc.WithWriteBufferSize(session.DefaultBufferSize),
		grpc.WithDisableServiceConfig(),
		grpc.WithUserAgent("bcd-sim/"+sim.Version))
	if err != nil {
		return err
	}
	defer cc.Close()
	resp, err := sessionv1.NewJoinServiceClient(cc).Renew(ctx, &sessionv1.RenewRequest{Csr: csr})
	if err != nil {
		return err
	}
	ders := resp.GetCertificateChain()
	if len(ders) == 0 || resp.GetRenewAfter() == nil {
		return errors.New("renew answer without a certificate or renew_after")
	}
	leaf, err := x509.ParseCertificate(ders[0])
	if err != nil {
		return err
	}
	roots := x509.NewCertPool()
	for _, der := range resp.GetNodeCaRoots() {
		c, err := x509.ParseCertificate(der)
		if err != nil {
			return err
		}
		roots.AddCert(c)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		return err
	}
	r.cert.Store(&tls.Certificate{Certificate: ders, PrivateKey: r.key, Leaf: leaf})
	return nil
}

// renewFor renews the daemons' certificates, round robin, opts.concurrency
// at a time, for opts.d, and prints
//
//	renew-start t_ms=1764000000000
//	renewed seconds=30.00 ok=15000 failed=0 rate=500.0 p50_ms=40.1 p99_ms=95.3
//	renew-error err="..."   (the first few failures)
//
// counting the renewals that ended within opts.d.
func renewFor(ctx context.Context, daemons []*sim.FakeDaemon, opts renewOptions) error {
	rs := make([]*renewer, len(daemons))
	for i, d := range daemons {
		r, err := newRenewer(d)
		if err != nil {
			return err
		}
		rs[i] = r
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	start := time.Now()
	deadline := start.Add(opts.d)
	fmt.Printf("renew-start t_ms=%d\n", start.UnixMilli())
	var (
		next      atomic.Int64
		failed    atomic.Int64
		mu        sync.Mutex
		latencies []time.Duration
		wg        sync.WaitGroup
	)
	for range opts.concurrency {
		wg.Go(func() {
			for ctx.Err() == nil {
				r := rs[int(next.Add(1)-1)%len(rs)]
				t0 := time.Now()
				rctx, rcancel := context.WithTimeout(ctx, session.DefaultRenewTimeout)
				err := r.renew(rctx)
				rcancel()
				t1 := time.Now()
				if t1.After(deadline) {
					cancel()
					return
				}
				if err != nil {
					if n := failed.Add(1); n <= 5 {
						fmt.Printf("renew-error err=%q\n", err.Error())
					}
					continue
				}
				mu.Lock()
				latencies = append(latencies, t1.Sub(t0))
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	secs := opts.d.Seconds()
	slices.Sort(latencies)
	pct := func(p int) float64 {
		if len(latencies) == 0 {
			return 0
		}
		return float64(latencies[min(len(latencies)*p/100, len(latencies)-1)].Microseconds()) / 1000
	}
	fmt.Printf("renewed seconds=%.2f ok=%d failed=%d rate=%.1f p50_ms=%.1f p99_ms=%.1f\n",
		secs, len(latencies), failed.Load(), float64(len(latencies))/secs, pct(50), pct(99))
	return nil
}
