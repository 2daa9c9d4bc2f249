class Callback:
    def setup(self, trainer, pl_module, stage):
        pass

    def on_before_zero_grad(self, trainer, pl_module, optimizer):
        pass

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        pass

    def on_train_end(self, trainer, pl_module):
        pass
