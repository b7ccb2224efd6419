package client

import (
	"context"
	"net/http"

	"github.com/fluidos-project/resource-broker/broker/api"
)

// Usage lists what each member holds as a requester against its limits
// (GET /api/v2/usage), in cluster id order.
func (c *Client) Usage(ctx context.Context) ([]api.MemberUsage, error) {
	var out []api.MemberUsage
	err := c.call(ctx, http.MethodGet, "/api/v2/usage", nil, nil, true, &out)
	return out, err
}
