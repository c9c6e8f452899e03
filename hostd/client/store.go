package client

import (
	"context"
	"net/http"

	"github.com/warrenvm/warren/hostd/wire"
)

// Store returns the tenant's part of the host's page store: logical and
// stored bytes of its snapshot layers, per namespace (GET /v1/store).
func (c *Client) Store(ctx context.Context) (wire.StoreStats, error) {
	var s wire.StoreStats
	err := c.call(ctx, http.MethodGet, "/v1/store", nil, &s)
	return s, err
}
