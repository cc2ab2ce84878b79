package events_test

import (
	"testing"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus/events"
)

// TestExtensionReadsWhatExtensionsHolds: ExtensionOf and StringExtension
// answer as a lookup in the SDK's copied Extensions map, for every
// attribute an event has and one it has not, in both spec versions.
func TestExtensionReadsWhatExtensionsHolds(t *testing.T) {
	for _, version := range []string{event.CloudEventsVersionV1, event.CloudEventsVersionV03} {
		t.Run(version, func(t *testing.T) {
			e := event.New(version)
			require.NoError(t, e.Context.SetExtension(events.ExtTenant, "acme"))
			require.NoError(t, e.Context.SetExtension(events.ExtRunID, "01J00000000000000000000RUN"))
			require.NoError(t, e.Context.SetExtension("count", 3))
			for _, name := range []string{events.ExtTenant, events.ExtRunID, "count", events.ExtPool} {
				want, wantOK := e.Extensions()[name]
				got, ok := events.ExtensionOf(&e, name)
				assert.Equal(t, wantOK, ok, name)
				assert.Equal(t, want, got, name)
				s, _ := want.(string)
				assert.Equal(t, s, events.StringExtension(&e, name), name)
			}
		})
	}
	var empty event.Event
	_, ok := events.ExtensionOf(&empty, events.ExtTenant)
	assert.False(t, ok, "an event without a context has no extension")
}
