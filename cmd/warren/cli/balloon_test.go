package cli

import (
	"encoding/json"
	"regexp"
	"strings"
	"testing"
)

// warren balloon and templates create --balloon against a stand-in
// daemon: show, set the target (0 included) and the statistics interval,
// --json, the daemon's refusals, and the routing of the verb.
func TestDaemonBalloonVerb(t *testing.T) {
	stub := stubDaemon(t)
	run := func(want int, args ...string) (string, string) { t.Helper(); return expect(t, want, "", args...) }

	tpl, _ := run(0, "templates", "create", "--balloon", "--kernel", "vmlinux", "--mem", "128")
	tpl = strings.TrimSpace(tpl)
	if !stub.LastTemplateRequest().Balloon {
		t.Fatalf("templates create --balloon sent %+v", stub.LastTemplateRequest())
	}
	if out, _ := run(0, "templates", "--json"); !strings.Contains(out, `"balloon": true`) {
		t.Errorf("templates --json: %s", out)
	}
	run(0, "create", "--template", tpl, "--name", "bal")

	out, _ := run(0, "balloon", "bal")
	for _, want := range []string{"target:", "0 MiB (0 pages)", "free page reporting:", "yes", "statistics:", "never",
		"free-memory", "counters:", "inflated pages"} {
		if !strings.Contains(out, want) {
			t.Errorf("balloon: no %q in %q", want, out)
		}
	}
	out, _ = run(0, "balloon", "--target", "64", "--stats-interval", "5", "bal")
	if !regexp.MustCompile(`target: +64 MiB \(16384 pages\)`).MatchString(out) || !strings.Contains(out, "every 5s") ||
		!regexp.MustCompile(`inflated pages +16384`).MatchString(out) {
		t.Errorf("balloon --target 64 --stats-interval 5: %q", out)
	}
	out, _ = run(0, "balloon", "--json", "bal")
	var rep struct {
		TargetMiB      *uint64 `json:"target_mib"`
		StatsIntervalS float64 `json:"stats_interval_s"`
		Counters       map[string]uint64
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil || rep.TargetMiB == nil || *rep.TargetMiB != 64 ||
		rep.StatsIntervalS != 5 || rep.Counters["inflated_pages"] != 16384 {
		t.Errorf("balloon --json: %+v %v: %s", rep, err, out)
	}
	if out, _ := run(0, "ls", "--json"); !strings.Contains(out, `"balloon_target_mib": 64`) {
		t.Errorf("ls --json after balloon --target 64: %s", out)
	}
	// 0 is a target (give it all back), not "unset".
	if out, _ := run(0, "balloon", "--target", "0", "bal"); !regexp.MustCompile(`target: +0 MiB`).MatchString(out) {
		t.Errorf("balloon --target 0: %q", out)
	}
	if out, _ := run(0, "ls", "--json"); !strings.Contains(out, `"balloon_target_mib": 0`) {
		t.Errorf("ls --json after balloon --target 0: %s", out)
	}

	// The daemon's refusals fail the command and print nothing.
	if out, errOut := run(1, "balloon", "--target", "129", "bal"); out != "" || !strings.Contains(errOut, "more than the sandbox's 128 MiB") {
		t.Errorf("balloon --target 129: %q %q", out, errOut)
	}
	plainTpl, _ := run(0, "templates", "create", "--kernel", "vmlinux")
	plain, _ := run(0, "create", "--template", strings.TrimSpace(plainTpl))
	if _, errOut := run(1, "balloon", strings.TrimSpace(plain)); !strings.Contains(errOut, "has no balloon (its template was created without --balloon)") {
		t.Errorf("balloon without one: %q", errOut)
	}
	run(0, "pause", "bal")
	run(0, "balloon", "bal")
	if _, errOut := run(1, "balloon", "--target", "1", "bal"); !strings.Contains(errOut, "is paused") {
		t.Errorf("balloon --target of a paused sandbox: %q", errOut)
	}
	run(1, "--tenant", "other", "balloon", "bal")
	run(2, "balloon")
	run(2, "balloon", "--target", "x", "bal")

	// Always the daemon's verb; --balloon takes no value.
	for _, args := range [][]string{{"balloon", "box"}, {"balloon", "--target", "64", "sb-0123456789ab"}, {"templates", "create", "--balloon", "--kernel", "k"}} {
		if _, ok := routeOnly(args); !ok {
			t.Errorf("warren %s: not the daemon's", strings.Join(args, " "))
		}
	}
	if got := positionals([]string{"--balloon", "--kernel", "k", "x"}); len(got) != 1 || got[0] != "x" {
		t.Errorf("positionals with --balloon: %q", got)
	}
}

// The top-level usage (warren help, warren with no arguments) lists every
// daemon verb, balloon and templates create --balloon included.
func TestDaemonUsageListsVerbs(t *testing.T) {
	out, _ := expect(t, 0, "", "help")
	for name := range daemonVerbs {
		verb, _, _ := strings.Cut(name, " ")
		if !regexp.MustCompile(`(?m)^  ` + verb + `\b`).MatchString(out) {
			t.Errorf("warren help does not list %q", verb)
		}
	}
	for _, want := range []string{"[--target MiB] [--stats-interval S] SANDBOX", "[--network] [--balloon]"} {
		if !strings.Contains(out, want) {
			t.Errorf("warren help lacks %q", want)
		}
	}
	_, errOut := expect(t, 2, "", "balloon")
	if !strings.Contains(errOut, "usage: warren balloon [--target MiB] [--stats-interval S] SANDBOX") {
		t.Errorf("warren balloon without a sandbox: %q", errOut)
	}
}
