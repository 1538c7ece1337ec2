package main

import (
	"math"
	"sort"
	"time"
)

// samples are measured numbers; add stores a duration in milliseconds.
type samples []float64

func (d *samples) add(v time.Duration) { *d = append(*d, float64(v)/float64(time.Millisecond)) }

func (d samples) sorted() []float64 {
	s := append([]float64(nil), d...)
	sort.Float64s(s)
	return s
}

// percentile is the nearest-rank percentile p (0 < p <= 100).
func (d samples) percentile(p float64) float64 {
	s := d.sorted()
	if len(s) == 0 {
		return math.NaN()
	}
	i := int(math.Ceil(p/100*float64(len(s)))) - 1
	return s[min(max(i, 0), len(s)-1)]
}

func (d samples) median() float64 {
	s := d.sorted()
	if len(s) == 0 {
		return math.NaN()
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func (d samples) min() float64 { return d.percentile(0) }
func (d samples) max() float64 { return d.percentile(100) }

func (d samples) mean() float64 {
	if len(d) == 0 {
		return math.NaN()
	}
	var sum float64
	for _, v := range d {
		sum += v
	}
	return sum / float64(len(d))
}
