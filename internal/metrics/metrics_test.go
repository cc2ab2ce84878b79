package metrics_test

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/actionbus/actionbus/internal/metrics"
)

func TestValueReadsWhatWasRecorded(t *testing.T) {
	m := metrics.New()
	_, found := m.Value("actionbus_run_state_conflicts_total")
	assert.True(t, found, "a counter without labels exists from the start")
	m.StateConflict()
	m.StateConflict()
	v, _ := m.Value("actionbus_run_state_conflicts_total")
	assert.Equal(t, 2.0, v)

	m.PartitionMoved(true, 3)
	m.PartitionMoved(false, 2)
	v, _ = m.Value("actionbus_partitions_owned")
	assert.Equal(t, 2.0, v, "a gauge reads its last value")
	v, _ = m.Value("actionbus_partition_moves_total")
	assert.Equal(t, 2.0, v, "a labelled counter reads the sum of its series")

	_, found = m.Value("actionbus_no_such_metric")
	assert.False(t, found)
	var none *metrics.Metrics
	none.StateConflict() // a nil Metrics records nothing and does not panic
}
