// Package openaihttp is the broker's OpenAI-compatible HTTP ingress: it
// validates requests, submits them to the broker and turns each Call's
// chunks into SSE events or one assembled JSON response. Routes are listed in
// routes.go; errors always have OpenAI's shape.
package openaihttp
