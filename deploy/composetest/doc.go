// Package composetest checks compose.yaml and the Dockerfile without a
// Docker daemon: build targets exist, every command flag is one that the
// real binary accepts (asked in-process, or from its -h usage), every URL
// names a service of the file, and the NATS services form one JetStream
// cluster that the broker and agents reach. The commented vLLM example in
// compose.yaml is uncommented and checked the same way.
package composetest
