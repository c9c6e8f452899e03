package kube

import (
	"context"
	"fmt"
	"io"

	"github.com/warrenvm/warren/fleet/objstore"
	hc "github.com/warrenvm/warren/hostd/client"
)

// ObjectSnapshots is the SnapshotStore (and TemplateStore) over the
// fleet's object store (fleet/objstore): a snapshot travels as the
// daemon's sandbox bundle (GET /v1/sandboxes/{id}/bundle, POST
// /v1/sandboxes/import), a template as its template bundle (GET
// /v1/templates/{id}/bundle, POST /v1/templates/import), stored under the
// tenant, content-addressed and, for a tenant with a key, encrypted.
// References are "s3://BUCKET/TENANT/MANIFEST".
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
	var sb *hc.Sandbox
	if err := o.fetch(ctx, c, ref, func(r io.Reader) error {
		var err error
		sb, err = c.ImportBundle(ctx, r, labels)
		return err
	}); err != nil {
		return "", err
	}
	if _, err := c.Resume(ctx, sb.ID, nil); err != nil {
		c.Delete(context.WithoutCancel(ctx), sb.ID)
		return "", fmt.Errorf("resume %s (from %s): %w", sb.ID, ref, err)
	}
	return sb.ID, nil
}

// UploadTemplate stores the client's tenant's ready template id as a
// template bundle and returns its reference.
func (o *ObjectSnapshots) UploadTemplate(ctx context.Context, c *hc.Client, id string) (string, error) {
	rc, err := c.ExportTemplateBundle(ctx, id)
	if err != nil {
		return "", fmt.Errorf("export template %s: %w", id, err)
	}
	defer rc.Close()
	ref, err := o.Store.PutBundle(ctx, c.Tenant(), rc)
	if err != nil {
		return "", fmt.Errorf("upload template %s: %w", id, err)
	}
	return ref.String(), nil
}

// ImportTemplate records on the daemon a ready template of the client's
// tenant from the template bundle ref names.
func (o *ObjectSnapshots) ImportTemplate(ctx context.Context, c *hc.Client, ref string) (*hc.Template, error) {
	var t *hc.Template
	err := o.fetch(ctx, c, ref, func(r io.Reader) error {
		var err error
		t, err = c.ImportTemplateBundle(ctx, r)
		return err
	})
	return t, err
}

// fetch streams the bundle ref names, which must be the client's
// tenant's, into imp.
func (o *ObjectSnapshots) fetch(ctx context.Context, c *hc.Client, ref string, imp func(io.Reader) error) error {
	r, err := objstore.ParseRef(ref)
	if err != nil {
		return err
	}
	if r.Tenant != c.Tenant() {
		return fmt.Errorf("snapshot %s is not tenant %s's", ref, c.Tenant())
	}
	pr, pw := io.Pipe()
	fetch := make(chan error, 1)
	go func() {
		err := o.Store.GetBundle(ctx, r, c.Tenant(), pw)
		pw.CloseWithError(err)
		fetch <- err
	}()
	err = imp(pr)
	pr.CloseWithError(io.ErrClosedPipe) // stops the fetch if the import failed first
	ferr := <-fetch
	if err != nil {
		if ferr != nil && ferr != io.ErrClosedPipe {
			return fmt.Errorf("fetch %s: %w", ref, ferr)
		}
		return fmt.Errorf("import %s: %w", ref, err)
	}
	return nil
}
