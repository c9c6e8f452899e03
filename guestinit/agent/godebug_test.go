//go:debug httpmuxgo121=1

// The agent's tests run with net/http's Go 1.21 mux, as the agent does in
// the guest: the initramfs's busybox build (u-root) makes it part of a
// module of an older go version, whose GODEBUG default is httpmuxgo121=1,
// where a "/processes/{id}" pattern matches only that literal path. A
// route that needs Go 1.22 patterns fails here as it would in the guest.

package agent
