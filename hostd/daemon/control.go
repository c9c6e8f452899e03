package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/warrenvm/warren/cow"
	"github.com/warrenvm/warren/hostd/store"
	"github.com/warrenvm/warren/vmmctl"
)

// The VMM's control API (`warren run|restore --api PATH`): its types and
// client are package vmmctl's.

// snapshotDisks turns a snapshot answer's disks into the record's.
func snapshotDisks(ds []cow.DiskFiles) []store.DiskLayer {
	var out []store.DiskLayer
	for _, d := range ds {
		out = append(out, store.DiskLayer{Index: d.Index, Layer: d.Layer, Chain: d.Chain})
	}
	return out
}

// liveDisks turns an answer's disks into the live tops the record keeps.
func liveDisks(ds []cow.DiskFiles) []store.LiveDisk {
	var out []store.LiveDisk
	for _, d := range ds {
		out = append(out, store.LiveDisk{Index: d.Index, Top: d.Top, Chain: d.Chain})
	}
	return out
}

// vmmCall sends req (JSON-encoded, nil for none) with method to
// /v1/VERB of the VMM control API on sock (vmmctl) and decodes the answer
// into resp. A refusal names the VMM; a 409 (the VM refuses in its
// current state, e.g. a rollback to a snapshot without disk state) stays
// the caller's conflict too.
func vmmCall(ctx context.Context, sock, method, verb string, req, resp any) error {
	var body []byte
	if req != nil {
		b, err := json.Marshal(req)
		if err != nil {
			return err
		}
		body = b
	}
	err := vmmctl.Client{Socket: sock}.Do(ctx, method, verb, body, resp)
	var ve *vmmctl.Error
	switch {
	case errors.As(err, &ve) && ve.Status == http.StatusConflict:
		return errf(http.StatusConflict, "VMM: %s", ve.Message)
	case errors.As(err, &ve):
		return fmt.Errorf("VMM: %s", ve.Message)
	}
	return err
}

// vmmAnswers reports whether the control API at sock answers HTTP at all.
func vmmAnswers(sock string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	err := vmmCall(ctx, sock, http.MethodGet, "egress", nil, nil)
	if err == nil {
		return nil
	}
	// Any HTTP answer (an error reply for a VM without egress) will do.
	var ne net.Error
	if errors.As(err, &ne) || errors.Is(err, context.DeadlineExceeded) || isConnErr(err) {
		return err
	}
	return nil
}

func isConnErr(err error) bool {
	var oe *net.OpError
	return errors.As(err, &oe)
}
