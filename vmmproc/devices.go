package vmmproc

import (
	"crypto/rand"
	"fmt"
	"net"
)

type diskSpec struct {
	path     string
	readOnly bool
	// name, when set, is the device's name instead of path (see
	// diskOption.Name).
	name string
}

// ParseMAC parses a unicast MAC, or makes a random locally administered one
// when s is empty.
func ParseMAC(s string) (net.HardwareAddr, error) {
	if s == "" {
		mac := make(net.HardwareAddr, 6)
		if _, err := rand.Read(mac); err != nil {
			return nil, err
		}
		mac[0] = mac[0]&^1 | 2 // unicast, locally administered
		return mac, nil
	}
	mac, err := net.ParseMAC(s)
	if err != nil || len(mac) != 6 {
		return nil, fmt.Errorf("--mac %q is not a 6-byte MAC address", s)
	}
	if mac[0]&1 != 0 {
		return nil, fmt.Errorf("--mac %s is a multicast address", s)
	}
	return mac, nil
}
