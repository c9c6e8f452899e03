package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"path/filepath"
	"text/tabwriter"

	"github.com/warrenvm/warren/hostd/crypt"
	"github.com/warrenvm/warren/hostd/pagestore"
	"github.com/warrenvm/warren/hostd/wire"
)

// `warren store stats`: the page store's logical vs stored bytes
// (hostd/pagestore), the tenant's from the daemon, or every tenant's from
// a state directory read in place (--state, for the host's operator).
func init() {
	daemonVerbs["store stats"] = daemonVerb{usage: storeStatsUsage, setup: storeStatsCmd}
	subcommands["store"] = []string{"stats"}
}

const storeStatsUsage = "store stats [--state DIR [--keys DIR]] [--json]\n\n" +
	"prints the page store's logical bytes (the snapshot layers as plain files) against the bytes\n" +
	"stored (chunks once per tenant and key, reference files, layers not in the store): the tenant's,\n" +
	"from the daemon, or with --state every tenant's from warren-hostd's state directory (read in place;\n" +
	"--keys: the daemon's --keys directory, to read sealed reference files)"

// storeStatsCmd is `warren store stats`.
func storeStatsCmd(d *daemonCmd) func() int {
	state := d.fs.String("state", "", "read warren-hostd's state directory DIR instead of asking the daemon")
	keys := d.fs.String("keys", "", "with --state: the daemon's key directory (sealed reference files)")
	return func() int {
		var all []wire.StoreStats
		if *state == "" {
			s, err := d.c.Store(d.ctx)
			if err != nil {
				return d.fail(err)
			}
			all = append(all, s)
		} else {
			var err error
			if all, err = storeStatsOffline(d.ctx, *state, *keys); err != nil {
				return d.fail(err)
			}
		}
		if *d.asJSON {
			enc := json.NewEncoder(d.stdout)
			enc.SetIndent("", "  ")
			if *state == "" {
				return exitOf(enc.Encode(all[0]))
			}
			return exitOf(enc.Encode(all))
		}
		printStoreStats(d.stdout, all)
		return 0
	}
}

func exitOf(err error) int {
	if err != nil {
		return 1
	}
	return 0
}

// storeStatsOffline computes every tenant's statistics from the state
// directory state; keyDir, when set, opens the namespaces of the tenants'
// current keys (others are counted by their chunk files only).
func storeStatsOffline(ctx context.Context, state, keyDir string) ([]wire.StoreStats, error) {
	st, err := pagestore.Open(filepath.Join(state, "pagestore"))
	if err != nil {
		return nil, err
	}
	dirs, err := st.Namespaces()
	if err != nil {
		return nil, err
	}
	var prov *crypt.LocalProvider
	if keyDir != "" {
		prov = &crypt.LocalProvider{Dir: keyDir}
	}
	var out []wire.StoreStats
	byTenant := map[string]int{}
	for _, nd := range dirs {
		i, ok := byTenant[nd.Tenant]
		if !ok {
			i = len(out)
			byTenant[nd.Tenant] = i
			out = append(out, wire.StoreStats{Tenant: nd.Tenant})
		}
		root := filepath.Join(state, "tenants", nd.Tenant)
		var ns *pagestore.Namespace
		if nd.Name == pagestore.PlainNamespace {
			ns, err = st.Plain(nd.Tenant)
		} else if prov != nil {
			if ns, err = st.Keyed(ctx, nd.Tenant, prov); err == nil && ns.Name() != nd.Name {
				ns = nil // an earlier key's: unreadable
			}
		}
		var s wire.StoreNamespace
		if ns != nil && err == nil {
			if s, err = ns.Stats(root); err != nil {
				return nil, err
			}
		} else {
			c, b, uerr := st.Usage(nd)
			if uerr != nil {
				return nil, uerr
			}
			s = wire.StoreNamespace{Tenant: nd.Tenant, Namespace: nd.Name, Keyed: nd.Name != pagestore.PlainNamespace, Chunks: c, ChunkBytes: b, Unreferenced: -1}
		}
		out[i].Namespaces = append(out[i].Namespaces, s)
	}
	for i := range out {
		out[i].Sum()
	}
	return out, nil
}

// printStoreStats prints one row per namespace and one per tenant.
func printStoreStats(w io.Writer, all []wire.StoreStats) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TENANT\tNAMESPACE\tLAYERS IN STORE\tLOGICAL\tSTORED\tCHUNKS\tUNREFERENCED\tPLAIN LAYERS\tRATIO\tCACHES")
	for _, s := range all {
		for _, n := range s.Namespaces {
			unref := fmt.Sprint(n.Unreferenced)
			logical := mib(n.LogicalBytes)
			if n.Unreferenced < 0 {
				unref, logical = "?", "? (sealed; --keys)"
			}
			fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%d\t%s\t%d (%s)\t%s\t%d (%s)\n", s.Tenant, n.Namespace, n.Refs, logical,
				mib(n.ChunkBytes+n.RefBytes), n.Chunks, unref, n.Layers, mib(n.LayerBytes), ratio(n.LogicalBytes, n.ChunkBytes+n.RefBytes),
				n.Caches, mib(n.CacheBytes))
		}
		fmt.Fprintf(tw, "%s\t(total)\t\t%s\t%s\t\t\t\t%s\t%s\n", s.Tenant, mib(s.LogicalBytes), mib(s.StoredBytes), ratio(s.LogicalBytes, s.StoredBytes), mib(s.CacheBytes))
	}
	tw.Flush()
}

func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

func ratio(logical, stored int64) string {
	if stored <= 0 || logical <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.2fx", float64(logical)/float64(stored))
}
