package server_test

import (
	"github.com/fluidos-project/resource-broker/broker/api"
	"github.com/fluidos-project/resource-broker/internal/brokertest"
)

func reservation(id, cpu, memory string) api.ReservationRequest {
	return api.ReservationRequest{ID: id, Resources: brokertest.Quantities(cpu, memory, "")}
}

// reservationLease is a lease: it ends hold-time (here the lease) after the decision unless renewed.
func reservationLease(id, cpu, memory, lease string) api.ReservationRequest {
	r := reservation(id, cpu, memory)
	r.Lease = lease
	return r
}
