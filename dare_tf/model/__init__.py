"""The model as one package: `DareModel` (`dare_model`, any backend), what it
reads (`config`: `ModelConfig`, `BehaviorField`; `presets`: the paper's models
as overrides of it; `inputs`: the input names and the ids a batch carries;
`tasks`: the click loss), how it trains (`training`, `execution`: the
TensorFlow backend's compiled step) and how it ranks for serving (`serving`).
Below it: `dare_tf.layers` and the search family (`dare_tf.search`); above
it: the trainer, the export and the analyses. Its public names are
`dare_tf`'s (`dare_tf.DareModel`, `dare_tf.ModelConfig`, ...); importing this
package loads nothing.
"""
