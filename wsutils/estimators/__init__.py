"""Word-sensitivity estimators and bounds, one module per concern (import from the module;
nothing is re-exported here): random features (``rf``), deep random features (``drf``), the
fast attention estimator (``self_attention``) and its objectives (``objectives``), the take-over
constructions and certificates (``takeover``), softmax attention's upper certificates
(``softmax_upper``), the certificate of each map (``upper``), interval bound propagation as a
baseline (``verifiers``), ReLU attention (``relu``), the authors' estimator (``authors``), the rate
models (``rates``) and the softmax chapter's laws (``softmax_laws``)."""
