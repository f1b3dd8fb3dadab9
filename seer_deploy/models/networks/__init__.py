"""The networks in torch: the mask predictor (the reference for every backend), its MLP statistics, vision towers."""
