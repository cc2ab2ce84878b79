package events

import "github.com/cloudevents/sdk-go/v2/event"

// ExtensionOf returns the value of e's extension attribute name (lower
// case, as the CloudEvents SDK keeps them) and whether e has it. It reads
// the attribute in place: event.Event.Extensions copies every extension
// into a new map at each call, which services did several times per
// event they received.
func ExtensionOf(e *event.Event, name string) (any, bool) {
	switch ec := e.Context.(type) {
	case nil:
		return nil, false
	case *event.EventContextV1:
		v, ok := ec.Extensions[name]
		return v, ok
	default:
		v, err := e.Context.GetExtension(name)
		if err != nil {
			return nil, false
		}
		return v, true
	}
}

// StringExtension is e's extension attribute name when it is a string, ""
// when e has none or one of another type.
func StringExtension(e *event.Event, name string) string {
	v, _ := ExtensionOf(e, name)
	s, _ := v.(string)
	return s
}
