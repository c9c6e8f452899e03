package uffd

import (
	"testing"
	"unsafe"
)

// TestABISizes: the structures have linux/userfaultfd.h's sizes, and the
// ioctl numbers are _IOC's encoding of them (and the values the C headers
// give on x86-64).
func TestABISizes(t *testing.T) {
	for _, c := range []struct {
		name      string
		got, want uintptr
	}{
		{"uffdio_api", unsafe.Sizeof(uffdioAPI{}), 24},
		{"uffdio_range", unsafe.Sizeof(uffdioRange{}), 16},
		{"uffdio_register", unsafe.Sizeof(uffdioRegister{}), 32},
		{"uffdio_copy", unsafe.Sizeof(uffdioCopy{}), 40},
		{"uffdio_zeropage", unsafe.Sizeof(uffdioZeropage{}), 32},
	} {
		if c.got != c.want {
			t.Errorf("sizeof(struct %s) = %d, want %d", c.name, c.got, c.want)
		}
	}
	ioc := func(dir, nr, size uintptr) uintptr { return dir<<30 | size<<16 | uffdioType<<8 | nr }
	rw := uintptr(iocRead | iocWrite)
	for _, c := range []struct {
		name      string
		got, want uintptr
		c         uintptr // the value from the C headers
	}{
		{"UFFDIO_API", IoctlAPI, ioc(rw, cmdAPI, unsafe.Sizeof(uffdioAPI{})), 0xc018aa3f},
		{"UFFDIO_REGISTER", IoctlRegister, ioc(rw, cmdRegister, unsafe.Sizeof(uffdioRegister{})), 0xc020aa00},
		{"UFFDIO_UNREGISTER", IoctlUnregister, ioc(iocRead, cmdUnregister, unsafe.Sizeof(uffdioRange{})), 0x8010aa01},
		{"UFFDIO_WAKE", IoctlWake, ioc(iocRead, cmdWake, unsafe.Sizeof(uffdioRange{})), 0x8010aa02},
		{"UFFDIO_COPY", IoctlCopy, ioc(rw, cmdCopy, unsafe.Sizeof(uffdioCopy{})), 0xc028aa03},
		{"UFFDIO_ZEROPAGE", IoctlZeropage, ioc(rw, cmdZeropage, unsafe.Sizeof(uffdioZeropage{})), 0xc020aa04},
		{"USERFAULTFD_IOC_NEW", IoctlNew, ioc(iocNone, 0, 0), 0xaa00},
	} {
		if c.got != c.want || c.got != c.c {
			t.Errorf("%s = %#x, want %#x (_IOC) and %#x (C)", c.name, c.got, c.want, c.c)
		}
	}
	if msgSize != 32 || msgOffFaultAddr+8 > msgSize {
		t.Errorf("struct uffd_msg layout: size %d, address at %d", msgSize, msgOffFaultAddr)
	}
}
