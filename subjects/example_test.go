package subjects_test

import (
	"fmt"

	"github.com/switchyard-ai/switchyard/subjects"
)

func ExampleBuilder_Jobs() {
	b := subjects.Must(subjects.DefaultPrefix)
	subj, _ := b.Jobs("meta-llama/Llama-3.1-8B", subjects.PoolRegular)
	fmt.Println(subj)
	parsed, _ := b.ParseJobs(subj)
	fmt.Println(parsed.Model, parsed.Pool)
	// Output:
	// sy.jobs.meta-llama_2FLlama-3_2E1-8B.regular
	// meta-llama/Llama-3.1-8B regular
}
