package server_test

import (
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/fluidos-project/resource-broker/broker/api"
)

func mustQ(s string) *resource.Quantity {
	q := resource.MustParse(s)
	return &q
}

func quantities(cpu, memory, gpu string) api.Quantities {
	q := api.Quantities{CPU: mustQ(cpu), Memory: mustQ(memory)}
	if gpu != "" {
		q.GPU = mustQ(gpu)
	}
	return q
}

func reservation(id, cpu, memory string) api.ReservationRequest {
	return api.ReservationRequest{ID: id, Resources: quantities(cpu, memory, "")}
}
