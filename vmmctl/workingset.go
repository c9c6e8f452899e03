package vmmctl

import (
	"context"
	"net/http"

	"github.com/warrenvm/warren/memsnap/uffd"
)

// The working set of a VM restored in the uffd memory mode (`warren
// restore --lazy=uffd`): the fault server's counters, and the pages the
// guest touched first, recorded with --record-working-set until
// POST /v1/working-set/save writes them to that file.
//
//	GET  /v1/working-set                  -> WorkingSetReply
//	POST /v1/working-set/save  {}         -> WorkingSetReply (the file written)

// WorkingSetSaveRequest is the body of POST /v1/working-set/save: empty,
// the file is the one --record-working-set named.
type WorkingSetSaveRequest struct{}

// WorkingSetReply answers both working-set calls.
type WorkingSetReply struct {
	// Mode is the VM's memory mode (vmsnap.MemoryMode: "eager", "mmap",
	// "uffd"); empty for a VM booted from a kernel.
	Mode string `json:"mode"`
	// Path is the working set file: the one being recorded (GET) or the
	// one written (save); empty without --record-working-set.
	Path string `json:"path,omitempty"`
	// Pages and Runs are the working set written (save only): its pages
	// and the runs they encode to.
	Pages uint64 `json:"pages,omitempty"`
	Runs  int    `json:"runs,omitempty"`
	// Stats are the fault server's counters; nil outside the uffd mode
	// (or where it fell back to mmap).
	Stats *uffd.Stats `json:"stats,omitempty"`
}

// WorkingSet answers the memory mode and the fault server's counters.
func (c Client) WorkingSet(ctx context.Context) (*WorkingSetReply, error) {
	var r WorkingSetReply
	if err := c.Do(ctx, http.MethodGet, "working-set", nil, &r); err != nil {
		return nil, err
	}
	return &r, nil
}

// SaveWorkingSet stops recording the working set and writes it to the
// file --record-working-set named (atomically); a VM that records none
// refuses with 409.
func (c Client) SaveWorkingSet(ctx context.Context) (*WorkingSetReply, error) {
	var r WorkingSetReply
	if err := c.Call(ctx, "working-set/save", WorkingSetSaveRequest{}, &r); err != nil {
		return nil, err
	}
	return &r, nil
}
