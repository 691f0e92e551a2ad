package contract

import (
	"errors"
	"fmt"
	"strings"
)

// DeadLetterQueue is the queue name reserved for the dead letters: no function's queue (AnnotationQueue) may take
// it, or any name starting with it, or the queue worker would consume its own dead letters.
const DeadLetterQueue = "faas-dead-letter"

// MaxQueueNameLen is the longest queue name.
const MaxQueueNameLen = 64

// ErrInvalidQueueName is returned (wrapped) for a queue name that cannot name a stream.
var ErrInvalidQueueName = errors.New("invalid queue name")

// ErrReservedQueueName is returned (wrapped, together with ErrInvalidQueueName) for a queue name that is reserved.
var ErrReservedQueueName = errors.New("reserved queue name")

// ReservedQueue reports whether q is a reserved queue name: the dead-letter queue's name or any name starting with
// it (case-insensitively, so that no queue can be confused with it on a case-insensitive file system).
func ReservedQueue(q string) bool {
	return len(q) >= len(DeadLetterQueue) && strings.EqualFold(q[:len(DeadLetterQueue)], DeadLetterQueue)
}

// ValidateQueueName checks that q can name a queue: 1 to MaxQueueNameLen characters of [A-Za-z0-9_-] (a valid NATS
// stream name and subject token once prefixed, and a safe folder name in the JetStream store), not reserved.
func ValidateQueueName(q string) error {
	if q == "" || len(q) > MaxQueueNameLen {
		return fmt.Errorf("%w: %q must be 1 to %d characters", ErrInvalidQueueName, q, MaxQueueNameLen)
	}
	for _, c := range q {
		ok := c == '-' || c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')
		if !ok {
			return fmt.Errorf("%w: %q may hold only letters, digits, '-' and '_'", ErrInvalidQueueName, q)
		}
	}
	if ReservedQueue(q) {
		return fmt.Errorf("%w: %w: %q is reserved for the dead letters (stream OF_%s)", ErrInvalidQueueName,
			ErrReservedQueueName, q, DeadLetterQueue)
	}
	return nil
}
