package cli

import (
	"crypto/rand"
	"fmt"
	"net"
	"strings"
)

// diskFlag is a repeatable --disk PATH[,ro] flag.
type diskFlag []diskSpec

type diskSpec struct {
	path     string
	readOnly bool
	// name, when set, is the device's name instead of path (see
	// diskOption.Name).
	name string
}

func (d *diskFlag) String() string {
	var s []string
	for _, x := range *d {
		if x.readOnly {
			s = append(s, x.path+",ro")
		} else {
			s = append(s, x.path)
		}
	}
	return strings.Join(s, " ")
}

// Set parses PATH[,ro] (or PATH,rw).
func (d *diskFlag) Set(v string) error {
	parts := strings.Split(v, ",")
	spec := diskSpec{path: parts[0]}
	if spec.path == "" {
		return fmt.Errorf("empty disk path")
	}
	for _, opt := range parts[1:] {
		switch opt {
		case "ro":
			spec.readOnly = true
		case "rw":
			spec.readOnly = false
		default:
			return fmt.Errorf("unknown disk option %q (want ro or rw)", opt)
		}
	}
	*d = append(*d, spec)
	return nil
}

// parseMAC parses a unicast MAC, or makes a random locally administered one
// when s is empty.
func parseMAC(s string) (net.HardwareAddr, error) {
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
