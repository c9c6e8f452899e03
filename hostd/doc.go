// Package hostd owns the host daemon: API, sandbox lifecycle, storage, credentials, encryption (the warren-hostd issue).
//
// It is empty until that issue lands; the folder exists so the layout in
// README.md is visible from the start.
package hostd
