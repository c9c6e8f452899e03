// Package ident checks the names Warren takes from tenants, its records
// and the VMM's grants before they become parts of paths, object keys or
// cgroup names. It uses no regular expressions: a compiled regexp with a
// bounded repetition (`{0,127}`) is tens of kilobytes of heap, compiled
// at package initialisation in every process, each VMM's included (the
// VMM is the warren binary), and kept for the process's life.
package ident

// Tenant reports whether s is a tenant's name: 1 to 63 bytes of
// [a-z0-9-].
func Tenant(s string) bool {
	if len(s) < 1 || len(s) > 63 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !lower(c) && !digit(c) && c != '-' {
			return false
		}
	}
	return true
}

// Name reports whether s is 1 to max bytes of [A-Za-z0-9_.-] whose first
// is a letter or a digit (so neither "." nor ".." nor a hidden file's
// name).
func Name(s string, max int) bool {
	if len(s) < 1 || len(s) > max || !alnum(s[0]) {
		return false
	}
	for i := 1; i < len(s); i++ {
		if c := s[i]; !alnum(c) && c != '_' && c != '.' && c != '-' {
			return false
		}
	}
	return true
}

// LowerHex reports whether s is n bytes of [0-9a-f].
func LowerHex(s string, n int) bool {
	if len(s) != n {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !digit(c) && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// Lower reports whether s is min to max bytes of [a-z].
func Lower(s string, min, max int) bool {
	if len(s) < min || len(s) > max {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !lower(s[i]) {
			return false
		}
	}
	return true
}

func lower(c byte) bool { return c >= 'a' && c <= 'z' }
func digit(c byte) bool { return c >= '0' && c <= '9' }
func alnum(c byte) bool { return lower(c) || digit(c) || (c >= 'A' && c <= 'Z') }
