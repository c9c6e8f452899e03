package stats

import (
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestPercentiles(t *testing.T) {
	var s []time.Duration
	for i := 100; i >= 1; i-- {
		s = append(s, time.Duration(i))
	}
	if Percentile(s, 50) != 50 || Percentile(s, 90) != 90 || Percentile(s, 99) != 99 || Percentile(s, 100) != 100 {
		t.Errorf("p50 %d p90 %d p99 %d", Percentile(s, 50), Percentile(s, 90), Percentile(s, 99))
	}
	if Median([]time.Duration{3, 1, 2}) != 2 || Median([]time.Duration{4, 1, 2, 3}) != 2 {
		t.Error("median")
	}
	if Percentile(nil, 50) != 0 || Median(nil) != 0 {
		t.Error("empty")
	}
	if s[0] != 100 {
		t.Error("input reordered")
	}
}

func TestTable(t *testing.T) {
	var b strings.Builder
	Table(&b, "boot", Summarise("warren", []time.Duration{2 * time.Second}), Summarise("qemu", []time.Duration{4 * time.Second}))
	if !strings.Contains(b.String(), "0.50") || !strings.Contains(b.String(), "warren") {
		t.Errorf("table:\n%s", b.String())
	}
}

func TestPercentileRows(t *testing.T) {
	a := Summary{P50: 1, P90: 2, P99: 3}
	b := Summary{P50: 4, P90: 5, P99: 6}
	rows := PercentileRows("rtt", a, b)
	want := []Row{{"rtt", "p50", []time.Duration{1, 4}}, {"", "p90", []time.Duration{2, 5}}, {"", "p99", []time.Duration{3, 6}}}
	if !reflect.DeepEqual(rows, want) {
		t.Errorf("rows %+v, want %+v", rows, want)
	}
}
