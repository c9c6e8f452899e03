package kube

import (
	"context"
	"fmt"
	"io"

	"github.com/warrenvm/warren/fleet/objstore"
	hc "github.com/warrenvm/warren/hostd/client"
)

// ObjectSnapshots is the SnapshotStore over the fleet's object store
// (fleet/objstore): a snapshot travels as the daemon's sandbox bundle
// (GET /v1/sandboxes/{id}/bundle, POST /v1/sandboxes/import), stored under
// the sandbox's tenant, content-addressed and, for a tenant with a key,
// encrypted. References are "s3://BUCKET/TENANT/MANIFEST".
type ObjectSnapshots struct {
	Store *objstore.Store
}

// Upload stores the latest snapshot of the tenant's sandbox id.
func (o *ObjectSnapshots) Upload(ctx context.Context, c *hc.Client, id string) (string, error) {
	rc, err := c.ExportBundle(ctx, id, "")
	if err != nil {
		return "", fmt.Errorf("export %s: %w", id, err)
	}
	defer rc.Close()
	ref, err := o.Store.PutBundle(ctx, c.Tenant(), rc)
	if err != nil {
		return "", fmt.Errorf("upload %s: %w", id, err)
	}
	return ref.String(), nil
}

// Restore makes a sandbox of the client's tenant from the bundle ref
// names and resumes it; on a failure to resume, the imported sandbox is
// deleted again.
func (o *ObjectSnapshots) Restore(ctx context.Context, c *hc.Client, ref string, labels map[string]string) (string, error) {
	r, err := objstore.ParseRef(ref)
	if err != nil {
		return "", err
	}
	if r.Tenant != c.Tenant() {
		return "", fmt.Errorf("snapshot %s is not tenant %s's", ref, c.Tenant())
	}
	pr, pw := io.Pipe()
	fetch := make(chan error, 1)
	go func() {
		err := o.Store.GetBundle(ctx, r, c.Tenant(), pw)
		pw.CloseWithError(err)
		fetch <- err
	}()
	sb, err := c.ImportBundle(ctx, pr, labels)
	pr.CloseWithError(io.ErrClosedPipe) // stops the fetch if the import failed first
	ferr := <-fetch
	if err != nil {
		if ferr != nil && ferr != io.ErrClosedPipe {
			return "", fmt.Errorf("fetch %s: %w", ref, ferr)
		}
		return "", fmt.Errorf("import %s: %w", ref, err)
	}
	if _, err := c.Resume(ctx, sb.ID, nil); err != nil {
		c.Delete(context.WithoutCancel(ctx), sb.ID)
		return "", fmt.Errorf("resume %s (from %s): %w", sb.ID, ref, err)
	}
	return sb.ID, nil
}
