// Package events owns what leaves the system when something changes: the
// CloudEvents 1.0 envelope every outbox row holds (JSON event format,
// https://github.com/cloudevents/spec/blob/v1.0.2/cloudevents/formats/json-format.md),
// the one list of event types (Types) and the Go struct of each type's data.
// docs/events.md lists the same types and fields; a test keeps the two equal.
//
// The store writes an event in the transaction of the change it describes
// (DESIGN.md, "Events"): the outbox row's topic is the event's type, its
// key the subject (the changed object's id) and its payload the envelope's
// JSON. Sinks, events.list and the event stream read that JSON as it is.
//
// The package imports nothing of the project, so that the store and every
// role may use it.
package events
