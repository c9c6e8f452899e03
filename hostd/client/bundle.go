package client

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sort"
)

// ExportBundle streams one snapshot of sandbox id (its latest when
// snapshot is "") as a bundle (GET /v1/sandboxes/{id}/bundle): a tar
// stream the caller reads to its end and closes. A stream the daemon cut
// short lacks its last file, "end", which ImportBundle's daemon refuses.
func (c *Client) ExportBundle(ctx context.Context, id, snapshot string) (io.ReadCloser, error) {
	p := sbPath(id, "/bundle")
	if snapshot != "" {
		p += "?snapshot=" + url.QueryEscape(snapshot)
	}
	resp, err := c.do(ctx, http.MethodGet, p, nil, "application/x-tar")
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}

// ImportBundle sends bundle r (ExportBundle's stream) to the daemon,
// which makes it a new suspended sandbox of the tenant with labels
// (POST /v1/sandboxes/import); Resume runs it.
func (c *Client) ImportBundle(ctx context.Context, r io.Reader, labels map[string]string) (*Sandbox, error) {
	q := url.Values{}
	keys := make([]string, 0, len(labels))
	for k := range labels {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		q.Add("label", k+"="+labels[k])
	}
	p := "/v1/sandboxes/import"
	if len(q) > 0 {
		p += "?" + q.Encode()
	}
	resp, err := c.send(ctx, http.MethodPost, p, "application/x-tar", r)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var sb Sandbox
	if err := json.NewDecoder(io.LimitReader(resp.Body, 4<<20)).Decode(&sb); err != nil {
		return nil, fmt.Errorf("warren-hostd: bad answer to POST /v1/sandboxes/import: %w", err)
	}
	return &sb, nil
}

// ExportTemplateBundle streams ready template id as a bundle
// (GET /v1/templates/{id}/bundle): a tar stream the caller reads to its
// end and closes. A stream the daemon cut short lacks its last file,
// "end", which ImportTemplateBundle's daemon refuses.
func (c *Client) ExportTemplateBundle(ctx context.Context, id string) (io.ReadCloser, error) {
	resp, err := c.do(ctx, http.MethodGet, "/v1/templates/"+url.PathEscape(id)+"/bundle", nil, "application/x-tar")
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}

// ImportTemplateBundle sends template bundle r (ExportTemplateBundle's
// stream) to the daemon, which records it as a new ready template of the
// tenant (POST /v1/templates/import) and answers its record.
func (c *Client) ImportTemplateBundle(ctx context.Context, r io.Reader) (*Template, error) {
	resp, err := c.send(ctx, http.MethodPost, "/v1/templates/import", "application/x-tar", r)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var t Template
	if err := json.NewDecoder(io.LimitReader(resp.Body, 4<<20)).Decode(&t); err != nil {
		return nil, fmt.Errorf("warren-hostd: bad answer to POST /v1/templates/import: %w", err)
	}
	return &t, nil
}
