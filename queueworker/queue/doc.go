// Package queue names the JetStream streams, subjects and headers of faas-gpu's asynchronous invocations, and
// creates the streams. It is shared by the front door (which publishes) and the worker (which consumes).
//
// A queue named q lives on stream "OF_<q>" with subject "<q>"; the default queue is "faas-request", so the default
// stream is "OF_faas-request" with subject "faas-request" (the OpenFaaS convention). A function picks another queue
// with the annotation com.openfaas.queue. Messages the worker cannot or will not deliver go to the dead-letter
// stream "OF_faas-dead-letter" (subjects "faas-dead-letter.<q>") with the reason in a header.
package queue
