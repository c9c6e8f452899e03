package qemu

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"time"
)

// QMP is a minimal QMP client: one command at a time, events skipped.
type QMP struct {
	c net.Conn
	r *bufio.Reader
}

// DialQMP connects to QEMU's QMP socket at path, retrying until timeout
// (QEMU creates it as it starts), and leaves capability negotiation.
func DialQMP(path string, timeout time.Duration) (*QMP, error) {
	deadline := time.Now().Add(timeout)
	var c net.Conn
	var err error
	for {
		if c, err = net.Dial("unix", path); err == nil {
			break
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("qmp %s: %w", path, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	q := &QMP{c: c, r: bufio.NewReader(c)}
	if _, err := q.r.ReadBytes('\n'); err != nil { // the greeting
		c.Close()
		return nil, fmt.Errorf("qmp greeting: %w", err)
	}
	if _, err := q.Call("qmp_capabilities", nil); err != nil {
		c.Close()
		return nil, err
	}
	return q, nil
}

// Call executes cmd with args (nil: none) and returns its "return" value.
func (q *QMP) Call(cmd string, args any) (json.RawMessage, error) {
	req := map[string]any{"execute": cmd}
	if args != nil {
		req["arguments"] = args
	}
	b, _ := json.Marshal(req)
	if _, err := q.c.Write(append(b, '\n')); err != nil {
		return nil, fmt.Errorf("qmp %s: %w", cmd, err)
	}
	for {
		line, err := q.r.ReadBytes('\n')
		if err != nil {
			return nil, fmt.Errorf("qmp %s: %w", cmd, err)
		}
		var resp struct {
			Return json.RawMessage `json:"return"`
			Error  *struct {
				Class string `json:"class"`
				Desc  string `json:"desc"`
			} `json:"error"`
			Event string `json:"event"`
		}
		if err := json.Unmarshal(line, &resp); err != nil {
			return nil, fmt.Errorf("qmp %s: %q: %w", cmd, line, err)
		}
		switch {
		case resp.Event != "":
			continue
		case resp.Error != nil:
			return nil, fmt.Errorf("qmp %s: %s: %s", cmd, resp.Error.Class, resp.Error.Desc)
		}
		return resp.Return, nil
	}
}

// Close closes the connection.
func (q *QMP) Close() { q.c.Close() }

// UnlimitedBandwidth lifts the migration bandwidth limit: QEMU's default
// (32 MiB/s) would make a migration a throttled transfer rather than a
// snapshot.
func (q *QMP) UnlimitedBandwidth() error {
	_, err := q.Call("migrate-set-parameters", map[string]any{"max-bandwidth": int64(1) << 40})
	return err
}

// Migration is one QEMU migration to a file.
type Migration struct {
	// Downtime and Total are query-migrate's downtime and total-time
	// (millisecond resolution).
	Downtime, Total time.Duration
	// Bytes is the file's size.
	Bytes int64
	// RAM is query-migrate's ram statistics.
	RAM map[string]any
}

// Migrate migrates the VM to file (live, as QMP migrate does, to
// "exec:cat > FILE"), waits for it to complete and continues the source
// VM.
func (q *QMP) Migrate(file string, timeout time.Duration) (Migration, error) {
	var m Migration
	os.Remove(file)
	if _, err := q.Call("migrate", map[string]any{"uri": "exec:cat > " + file}); err != nil {
		return m, err
	}
	deadline := time.Now().Add(timeout)
	for {
		raw, err := q.Call("query-migrate", nil)
		if err != nil {
			return m, err
		}
		var st struct {
			Status    string         `json:"status"`
			Downtime  int64          `json:"downtime"`
			TotalTime int64          `json:"total-time"`
			Error     string         `json:"error-desc"`
			RAM       map[string]any `json:"ram"`
		}
		if err := json.Unmarshal(raw, &st); err != nil {
			return m, err
		}
		switch {
		case st.Status == "completed" && st.TotalTime > 0: // 0: the previous migration's status, not yet reset
			m.Downtime, m.Total = time.Duration(st.Downtime)*time.Millisecond, time.Duration(st.TotalTime)*time.Millisecond
			m.RAM = st.RAM
			// cat may still be writing what QEMU sent: wait until the
			// file's size holds still.
			for m.Bytes = -1; ; time.Sleep(20 * time.Millisecond) {
				fi, err := os.Stat(file)
				if err != nil {
					return m, err
				}
				if fi.Size() == m.Bytes {
					break
				}
				m.Bytes = fi.Size()
			}
			if _, err := q.Call("cont", nil); err != nil {
				return m, fmt.Errorf("qemu: cont after migration: %w", err)
			}
			return m, nil
		case st.Status == "failed" || st.Status == "cancelled":
			return m, fmt.Errorf("qemu: migration %s: %s", st.Status, st.Error)
		}
		if time.Now().After(deadline) {
			return m, fmt.Errorf("qemu: migration still %q after %s", st.Status, timeout)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
