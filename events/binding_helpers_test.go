package events_test

import (
	"reflect"
	"testing"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus/events"
)

type eventT = event.Event

// boundEvent builds an event of a run of the default tenant (ext may
// override the tenant; a nil-valued extension removes it).
func boundEvent(t *testing.T, typ, runID string, data any, ext ...events.Extension) *event.Event {
	t.Helper()
	e := event.New()
	e.SetID(events.NewID())
	e.SetType(typ)
	e.SetSource("/test")
	if runID != "" {
		e.SetExtension(events.ExtRunID, runID)
		e.SetExtension(events.ExtTenant, events.DefaultTenant)
	}
	for _, x := range ext {
		e.SetExtension(x.Name, x.Value)
	}
	require.NoError(t, events.SetData(&e, events.ContentTypeJSON, data))
	return &e
}

func setRunID(data any, id string) {
	if f := reflect.ValueOf(data).Elem().FieldByName("RunID"); f.IsValid() {
		f.SetString(id)
	}
}
