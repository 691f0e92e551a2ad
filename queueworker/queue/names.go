package queue

import (
	"errors"
	"fmt"
	"strings"
)

// Names and headers of the asynchronous invocation path.
const (
	// DefaultQueue is the queue of functions without a com.openfaas.queue annotation.
	DefaultQueue = "faas-request"
	// AnnotationQueue names a function's queue.
	AnnotationQueue = "com.openfaas.queue"
	// StreamPrefix prefixes a queue's name to make its stream's name.
	StreamPrefix = "OF_"
	// DeadLetterStream keeps the messages the worker gave up on, with the reason.
	DeadLetterStream = "OF_faas-dead-letter"
	// DeadLetterSubjectPrefix prefixes the queue name in a dead-letter entry's subject.
	DeadLetterSubjectPrefix = "faas-dead-letter."

	// HeaderCallID identifies one asynchronous call, from the front door to the callback.
	HeaderCallID = "X-Call-Id"
	// HeaderStartTime is when the call entered the system, in Unix nanoseconds (the OpenFaaS gateway's format).
	HeaderStartTime = "X-Start-Time"
	// HeaderCallbackURL is where the worker POSTs the result.
	HeaderCallbackURL = "X-Callback-Url"
	// HeaderFunctionStatus is the function's HTTP status code on a callback.
	HeaderFunctionStatus = "X-Function-Status"
	// HeaderFunctionName is the function's name on a callback.
	HeaderFunctionName = "X-Function-Name"
	// HeaderDurationSeconds is how long the final invocation took, in seconds, on a callback.
	HeaderDurationSeconds = "X-Duration-Seconds"
	// HeaderRetry is the number of the attempt whose result a callback carries, from 0.
	HeaderRetry = "X-Retry"
	// HeaderRetryMax is the largest retry number the worker would make.
	HeaderRetryMax = "X-Retry-Max"

	// HeaderDeadLetterReason says why a message went to the dead-letter stream (a dead-letter entry header).
	HeaderDeadLetterReason = "Faas-Dead-Letter-Reason"
	// HeaderDeadLetterQueue is the queue the message came from (a dead-letter entry header).
	HeaderDeadLetterQueue = "Faas-Queue"
	// HeaderDeadLetterFunction is the function the message was for, where known (a dead-letter entry header).
	HeaderDeadLetterFunction = "Faas-Function"
	// HeaderDeadLetterDeliveries is how many times JetStream delivered the message (a dead-letter entry header).
	HeaderDeadLetterDeliveries = "Faas-Deliveries"
	// HeaderDeadLetterSequence is the message's sequence in its stream (a dead-letter entry header).
	HeaderDeadLetterSequence = "Faas-Stream-Sequence"
)

// ErrInvalidName is returned (wrapped) for a queue name that cannot name a stream.
var ErrInvalidName = errors.New("invalid queue name")

// Stream is the stream of queue q.
func Stream(q string) string { return StreamPrefix + q }

// Subject is the subject messages of queue q are published on.
func Subject(q string) string { return q }

// DeadLetterSubject is the dead-letter subject of queue q.
func DeadLetterSubject(q string) string { return DeadLetterSubjectPrefix + q }

// ValidateName checks that q can name a stream and a subject: 1 to 64 characters of [A-Za-z0-9_-].
func ValidateName(q string) error {
	if q == "" || len(q) > 64 {
		return fmt.Errorf("%w: %q must be 1 to 64 characters", ErrInvalidName, q)
	}
	for _, c := range q {
		ok := c == '-' || c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')
		if !ok {
			return fmt.Errorf("%w: %q may hold only letters, digits, '-' and '_'", ErrInvalidName, q)
		}
	}
	return nil
}

// ErrInvalidFunctionName is returned (wrapped) for a function name that cannot appear in /function/{name}.
var ErrInvalidFunctionName = errors.New("invalid function name")

// ValidateFunctionName checks that name is a function name (optionally "name.namespace"): 1 to 253 characters of
// letters, digits, '-', '_' and '.', not starting or ending with '.', without "..".
func ValidateFunctionName(name string) error {
	if name == "" || len(name) > 253 {
		return fmt.Errorf("%w: %q must be 1 to 253 characters", ErrInvalidFunctionName, name)
	}
	if name[0] == '.' || name[len(name)-1] == '.' || strings.Contains(name, "..") {
		return fmt.Errorf("%w: %q may not start or end with '.' or contain \"..\"", ErrInvalidFunctionName, name)
	}
	for _, c := range name {
		ok := c == '-' || c == '_' || c == '.' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')
		if !ok {
			return fmt.Errorf("%w: %q may hold only letters, digits, '-', '_' and '.'", ErrInvalidFunctionName, name)
		}
	}
	return nil
}
