package queue

import (
	"errors"
	"fmt"
	"strings"

	"github.com/faas-gpu/faas-gpu/contract"
)

// Names and headers of the asynchronous invocation path.
const (
	// DefaultQueue is the queue of functions without a queue annotation (contract.AnnotationQueue).
	DefaultQueue = "faas-request"
	// StreamPrefix prefixes a queue's name to make its stream's name.
	StreamPrefix = "OF_"
	// DeadLetterStream keeps the messages the worker gave up on, with the reason (the queue name
	// contract.DeadLetterQueue is reserved for it).
	DeadLetterStream = StreamPrefix + contract.DeadLetterQueue
	// DeadLetterSubjectPrefix prefixes the queue name in a dead-letter entry's subject.
	DeadLetterSubjectPrefix = contract.DeadLetterQueue + "."

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
	// HeaderDeadLetterDropped says what of the original message the entry does not keep, and why (a dead-letter
	// entry header): "body" (bodies are not kept, or the entry would not fit), "message" (it was not a queue
	// request, so its headers could not be cleaned).
	HeaderDeadLetterDropped = "Faas-Dropped"
	// HeaderDeadLetterSize is the size in bytes of the original message (a dead-letter entry header).
	HeaderDeadLetterSize = "Faas-Message-Bytes"
)

// Stream is the stream of queue q.
func Stream(q string) string { return StreamPrefix + q }

// Subject is the subject messages of queue q are published on.
func Subject(q string) string { return q }

// DeadLetterSubject is the dead-letter subject of queue q.
func DeadLetterSubject(q string) string { return DeadLetterSubjectPrefix + q }

// ErrInvalidFunctionName is returned (wrapped) for a function name that cannot appear in /function/{name}.
var ErrInvalidFunctionName = errors.New("invalid function name")

// MaxFunctionNameLen is the longest function name and the longest namespace (a DNS-1123 label).
const MaxFunctionNameLen = 63

// SplitFunction splits a function reference as the gateway's /function/{name} and /async-function/{name} take it,
// "name" or "name.namespace" (faas-cli sends the latter), into its name and namespace ("" when none is given),
// the way the synchronous proxy does. Each part is 1 to MaxFunctionNameLen characters of letters, digits, '-' and
// '_'; there is at most one '.'.
func SplitFunction(ref string) (name, namespace string, err error) {
	name, namespace, dotted := strings.Cut(ref, ".")
	if err := checkFunctionPart(ref, "name", name); err != nil {
		return "", "", err
	}
	if dotted {
		if err := checkFunctionPart(ref, "namespace", namespace); err != nil {
			return "", "", err
		}
	}
	return name, namespace, nil
}

func checkFunctionPart(ref, what, part string) error {
	if part == "" || len(part) > MaxFunctionNameLen {
		return fmt.Errorf("%w: %q: the %s must be 1 to %d characters (name or name.namespace)", ErrInvalidFunctionName,
			ref, what, MaxFunctionNameLen)
	}
	for _, c := range part {
		ok := c == '-' || c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')
		if !ok {
			return fmt.Errorf("%w: %q: the %s may hold only letters, digits, '-' and '_' (name or name.namespace)",
				ErrInvalidFunctionName, ref, what)
		}
	}
	return nil
}

// ValidateFunctionName checks that ref is a function reference: "name" or "name.namespace" (see SplitFunction).
func ValidateFunctionName(ref string) error {
	_, _, err := SplitFunction(ref)
	return err
}
