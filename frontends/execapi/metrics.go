package execapi

import (
	"github.com/prometheus/client_golang/prometheus"
)

// metrics of the API. Label values are bounded: outcomes and refusal
// reasons are constants of this package, never user input.
type metrics struct {
	execs    *prometheus.CounterVec
	latency  prometheus.Histogram
	refusals *prometheus.CounterVec
	// forwarded counts requests sent on to the node of their Sandbox.
	forwarded prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		execs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sandbox_execapi_execs_total",
			Help: "Commands run through the exec API, by outcome (exited, refused, failed).",
		}, []string{"outcome"}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "sandbox_execapi_exec_duration_seconds",
			Help:    "Time from an accepted exec request to the command's exit status being sent.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300, 1800},
		}),
		refusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sandbox_execapi_refusals_total",
			Help: "Requests the exec and file API refused, by reason.",
		}, []string{"reason"}),
		forwarded: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sandbox_execapi_forwarded_total",
			Help: "Requests that reached this node through the API server and were forwarded to the exec API of the node running the claim's Sandbox.",
		}),
	}
	for _, c := range []prometheus.Collector{m.execs, m.latency, m.refusals, m.forwarded} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// Outcomes of an exec, the label values of the execs metric.
const (
	outcomeExited  = "exited"
	outcomeRefused = "refused"
	outcomeFailed  = "failed"
)
