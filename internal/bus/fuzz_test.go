package bus_test

import (
	"testing"
	"unicode/utf8"

	"github.com/nats-io/nats.go"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/bus"
)

// FuzzDecode feeds arbitrary header values and bodies to the codec: it must
// never panic, must return a coded error or an event that passes CloudEvent
// validation, and a decoded event must survive a re-encode round trip.
func FuzzDecode(f *testing.F) {
	f.Add("1.0", "id-1", "/src", events.TypeRunStarted, "application/json", "runid", "R1", false, []byte(`{"runId":"R1","kind":"agent"}`))
	f.Add("1.0", "Euro%20%E2%82%AC", `"quoted \"src\""`, "t", "application/msgpack", "planindex", "%C0%A0", false, []byte{0x82, 0xa1})
	f.Add("", "", "", "", "", "", "", true, []byte(`{"specversion":"1.0","id":"1","source":"/s","type":"t","data":{"a":1}}`))
	f.Add("", "", "", "", "", "", "", true, []byte(`{"specversion":"1.0","id":"1","source":"/s","type":"t","datacontenttype":"application/msgpack","data_base64":"gaFhAQ=="}`))
	f.Fuzz(func(t *testing.T, spec, id, source, typ, ct, extName, extValue string, structured bool, body []byte) {
		h := nats.Header{}
		if structured {
			h.Set("Content-Type", "application/cloudevents+json")
		} else {
			for k, v := range map[string]string{"ce-specversion": spec, "ce-id": id, "ce-source": source, "ce-type": typ, "ce-datacontenttype": ct, "ce-" + extName: extValue} {
				if v != "" {
					h[k] = []string{v}
				}
			}
		}
		e, err := bus.Decode("s", h, body)
		if err != nil {
			if actionbus.CodeOf(err) == actionbus.CodeInternal {
				t.Fatalf("decode error without a code: %v", err)
			}
			return
		}
		if err := e.Validate(); err != nil {
			t.Fatalf("decoded an invalid event: %v", err)
		}
		for _, mode := range []bus.Mode{bus.ModeBinary, bus.ModeStructured} {
			msg, err := bus.Encode("s", e, mode)
			if err != nil {
				t.Fatalf("re-encode %s: %v", mode, err)
			}
			again, err := bus.Decode("s", msg.Header, msg.Data)
			if err != nil {
				t.Fatalf("decode re-encoded %s: %v", mode, err)
			}
			if again.ID() != e.ID() || again.Type() != e.Type() || again.Source() != e.Source() {
				t.Fatalf("%s round trip changed attributes: %v vs %v", mode, e, again)
			}
		}
	})
}

// FuzzPercentRoundTrip checks that every string survives the binding's
// header encoding, and that encoded values are printable ASCII.
func FuzzPercentRoundTrip(f *testing.F) {
	for _, s := range []string{"", "Euro € 😀", `"%"`, "\x00\x7f", "plain"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		enc := bus.PercentEncode(s)
		for i := 0; i < len(enc); i++ {
			if enc[i] < 0x21 || enc[i] > 0x7e || enc[i] == '"' {
				t.Fatalf("encoded value %q has byte %#x", enc, enc[i])
			}
		}
		dec, err := bus.DecodeHeaderValue(enc)
		if !utf8.ValidString(s) {
			if err == nil {
				t.Fatalf("invalid UTF-8 %q decoded without error", s)
			}
			return
		}
		if err != nil || dec != s {
			t.Fatalf("round trip %q -> %q -> %q (%v)", s, enc, dec, err)
		}
	})
}
