package main

import (
	"bytes"
	"fmt"
	"net"
	"net/http"
	"os/exec"
	"strings"
	"time"

	"github.com/warrenvm/warren/internal/nsenter"
)

const (
	gatewayIP = "10.201.0.1"
	httpPort  = 8080
)

// netHost is the host side of the benchmark network: a namespace this
// program creates, holding both VMMs' taps bridged together, and an HTTP
// server on the bridge serving the blob. No traffic leaves the namespace.
type netHost struct {
	ns  string
	srv *http.Server
}

func ip(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return nil
}

func newNetHost(ns string, blobMiB int) (*netHost, error) {
	if err := ip("netns", "add", ns); err != nil {
		return nil, err
	}
	h := &netHost{ns: ns}
	for _, args := range [][]string{
		{"-n", ns, "link", "set", "lo", "up"},
		{"-n", ns, "link", "add", "br0", "type", "bridge"},
		{"-n", ns, "addr", "add", gatewayIP + "/24", "dev", "br0"},
		{"-n", ns, "link", "set", "br0", "up"},
	} {
		if err := ip(args...); err != nil {
			h.Close()
			return nil, err
		}
	}
	blob := bytes.Repeat([]byte("warren-bench-blob\n"), (blobMiB<<20)/18+1)[:blobMiB<<20]
	var ln net.Listener
	err := nsenter.Net(ns, func() (err error) {
		ln, err = net.Listen("tcp", fmt.Sprintf("%s:%d", gatewayIP, httpPort))
		return err
	})
	if err != nil {
		h.Close()
		return nil, err
	}
	h.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", fmt.Sprint(len(blob)))
		w.Write(blob)
	})}
	go h.srv.Serve(ln)
	return h, nil
}

// exec returns argv run inside the namespace.
func (h *netHost) exec(argv ...string) []string {
	return append([]string{"ip", "netns", "exec", h.ns}, argv...)
}

// tapUp waits for a VMM to create its tap, then puts it on the bridge.
func (h *netHost) tapUp(tap string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		err := ip("-n", h.ns, "link", "set", tap, "master", "br0")
		if err == nil {
			return ip("-n", h.ns, "link", "set", tap, "up")
		}
		if time.Now().After(deadline) {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Close stops the server and deletes the namespace.
func (h *netHost) Close() {
	if h.srv != nil {
		h.srv.Close()
	}
	ip("netns", "del", h.ns)
}
