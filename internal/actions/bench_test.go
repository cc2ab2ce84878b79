package actions_test

import (
	"encoding/json"
	"testing"

	"github.com/actionbus/actionbus/internal/actions"
)

func BenchmarkPrepareArgs(b *testing.B) {
	def := actions.Definition{Name: "docs.get", InputSchema: json.RawMessage(docSchema), HostOnlyKeys: []string{"tenant"}}
	if err := def.Normalize(); err != nil {
		b.Fatal(err)
	}
	c, err := actions.NewArgsChecker(def)
	if err != nil {
		b.Fatal(err)
	}
	in := map[string]any{"documentNo": "D-1", "pageSize": 20.0, "filter": map[string]any{"state": "open"}, "extra": true, "tenant": "x"}
	b.ReportAllocs()
	for b.Loop() {
		if _, _, issues := c.Prepare(in, actions.OriginModel); issues != nil {
			b.Fatal(issues)
		}
	}
}
