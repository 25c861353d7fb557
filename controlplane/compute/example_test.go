package compute_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/better-compute/better-compute/controlplane/compute"
	"github.com/better-compute/better-compute/controlplane/pkg/client"
	"github.com/better-compute/better-compute/controlplane/pkg/config"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
)

// The program's own http.ServeMux serves its own route and, under /api/,
// the control plane's API; a client calls nodes.list through it. The
// embedded SQLite default runs every role in the program's process (the
// gateway on a free loopback port here).
func Example() {
	dataDir, err := os.MkdirTemp("", "compute-example-")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dataDir)
	cfg, err := config.Load("", os.Getenv, config.Flags{DataDir: dataDir, GatewayListen: "127.0.0.1:0"})
	if err != nil {
		panic(err)
	}
	cp, err := compute.New(compute.Config{Config: cfg})
	if err != nil {
		panic(err)
	}

	mux := http.NewServeMux()
	mux.HandleFunc("GET /hello", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "hello from the program's own route")
	})
	mux.Handle(cfg.BasePath+"/", cp.Handler())
	srv := httptest.NewServer(mux)
	defer srv.Close()

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- cp.Run(ctx, nil) }()
	select {
	case <-cp.Ready():
	case err := <-done:
		panic(err)
	case <-time.After(2 * time.Minute):
		panic("the api role did not start")
	}

	res, err := http.Get(srv.URL + "/hello")
	if err != nil {
		panic(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	fmt.Print(string(body))

	// The embedded default writes its first admin token in the data
	// directory.
	token, err := os.ReadFile(filepath.Join(dataDir, "admin-token"))
	if err != nil {
		panic(err)
	}
	c := &client.Client{BaseURL: srv.URL + cfg.BasePath, Token: strings.TrimSpace(string(token))}
	var nodes apiv1.ListNodesResponse
	if err := c.Call(ctx, "nodes.list", &apiv1.ListNodesRequest{}, &nodes); err != nil {
		panic(err)
	}
	fmt.Println("nodes.list:", len(nodes.GetNodes()), "nodes")

	cancel()
	if err := <-done; err != nil {
		panic(err)
	}
	// Output:
	// hello from the program's own route
	// nodes.list: 0 nodes
}
