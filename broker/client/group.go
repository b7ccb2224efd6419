package client

import (
	"context"
	"net/http"

	"github.com/fluidos-project/resource-broker/broker/api"
)

// ReserveGroup asks for a gang, all or nothing (POST /api/v2/groups). The
// members' ids make it idempotent, so it is retried like Reserve. A group
// that does not fit is an *APIError with reason NoCapacity (IsNoCapacity).
func (c *Client) ReserveGroup(ctx context.Context, g api.GroupRequest) (api.Group, error) {
	var out api.Group
	if err := requireID("group", g.Group); err != nil {
		return out, err
	}
	for _, m := range g.Members {
		if err := requireID("member id", m.ID); err != nil {
			return out, err
		}
	}
	err := c.call(ctx, http.MethodPost, "/api/v2/groups", nil, g, true, &out)
	return out, err
}

// Protect replaces the caller's report of the reservations whose pods a
// PodDisruptionBudget protects now (PUT /api/v2/protections; idempotent,
// retried).
func (c *Client) Protect(ctx context.Context, ids []string) (api.ProtectResponse, error) {
	var out api.ProtectResponse
	err := c.call(ctx, http.MethodPut, "/api/v2/protections", nil, api.ProtectRequest{IDs: ids}, true, &out)
	return out, err
}
