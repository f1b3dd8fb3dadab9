"""The public model families: what each one's config.json means for the mask predictor."""
