// Package model holds the broker's domain types: what clusters advertise,
// what requesters ask for and what the broker decided, in the integer units
// the Redis scripts keep. It has no behaviour beyond validation and small
// arithmetic, so that the wire API (broker/api), its clients and the agent
// share these types without linking the store (go-redis and the scripts).
package model
