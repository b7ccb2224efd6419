package server_test

import (
	"github.com/fluidos-project/resource-broker/broker/api"
	"github.com/fluidos-project/resource-broker/internal/brokertest"
)

func reservation(id, cpu, memory string) api.ReservationRequest {
	return api.ReservationRequest{ID: id, Resources: brokertest.Quantities(cpu, memory, "")}
}
