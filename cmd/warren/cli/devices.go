package cli

import (
	"crypto/rand"
	"fmt"
	"io"
	"net"
	"strings"

	"github.com/warrenvm/warren/cow/disk"
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

// flattenCmd is `warren flatten OVERLAY OUT`: it writes the disk that a
// copy-on-write overlay (a fork's disk) and the images under it make up as
// one raw image OUT, which no longer depends on them.
func flattenCmd(args []string, stdout, stderr io.Writer) int {
	if len(args) != 2 {
		fmt.Fprint(stderr, "usage: warren flatten OVERLAY OUT\n\nwrites the disk an overlay (DISK.<id>.wcow, made by warren fork) shows as one raw image OUT.\n")
		return 2
	}
	o, err := disk.OpenChain(args[0], true)
	if err != nil {
		fmt.Fprintf(stderr, "warren flatten: %v\n", err)
		return 1
	}
	defer o.Close()
	if err := disk.Flatten(o, args[1]); err != nil {
		fmt.Fprintf(stderr, "warren flatten: %v\n", err)
		return 1
	}
	fmt.Fprintf(stdout, "flattened %s (%d bytes) to %s\n", args[0], o.Size(), args[1])
	return 0
}
