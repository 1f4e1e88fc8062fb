"""Word-sensitivity estimators and bounds: random features (rf), deep random features (drf),
attention (attention), ReLU attention (relu), the authors' estimator (authors), rate models
(rates)."""
